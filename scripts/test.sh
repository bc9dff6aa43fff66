#!/usr/bin/env bash
# Set up everything (virtualenv, pinned dependencies) and run the whole test suite.
source "$(dirname "$0")/bootstrap.sh"
python -m protos.generate --check
# The tests' JVMs map a class archive once it exists (tests/harness/class_archive.py): built, if this virtualenv
# has none, beside the first tests, and stopped if they end first.
python -m tests.harness.class_archive > .venv/class-archive.log 2>&1 &
ARCHIVE_BUILD=$!
# Four workers on CI's two cores: many tests wait (node processes, ZooKeeper sessions, Spark applications of their
# own) more than they compute, and with three the cores were idle a tenth of the time; an idle worker takes tests
# queued on a busy one (worksteal), so the slow Spark tests do not pile up at the end on one.
# LEDGER_TEST_WORKERS=0 runs in this process; a later -n of your own wins.
set +e
python -m pytest -n "${LEDGER_TEST_WORKERS:-4}" --dist worksteal "$@"
STATUS=$?
kill "$ARCHIVE_BUILD" 2>/dev/null
wait "$ARCHIVE_BUILD" 2>/dev/null
exit $STATUS
