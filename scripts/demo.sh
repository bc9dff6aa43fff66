#!/usr/bin/env bash
# Set up everything (virtualenv, pinned dependencies) and run the main job on the embedded default.
source "$(dirname "$0")/bootstrap.sh"
exec python -m connector.demo "$@"
