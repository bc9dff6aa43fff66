#!/usr/bin/env bash
# Set up everything (virtualenv, pinned dependencies) and run the whole test suite.
source "$(dirname "$0")/bootstrap.sh"
python -m protos.generate --check
# Three workers on CI's two cores: most tests wait (node processes, ZooKeeper sessions, Spark jobs) more than they
# compute; an idle worker takes tests queued on a busy one (worksteal), so the slow Spark tests do not pile up at
# the end on one. LEDGER_TEST_WORKERS=0 runs in this process; a later -n of your own wins.
exec python -m pytest -n "${LEDGER_TEST_WORKERS:-3}" --dist worksteal "$@"
