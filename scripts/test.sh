#!/usr/bin/env bash
# Set up everything (virtualenv, pinned dependencies) and run the whole test suite.
source "$(dirname "$0")/bootstrap.sh"
python -m protos.generate --check
exec python -m pytest "$@"
