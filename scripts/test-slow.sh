#!/usr/bin/env bash
# The tests marked `slow` (the rest of the architecture matrix): the README's test script with pytest's marker.
set -euo pipefail
exec bash "$(dirname "$0")/test.sh" -m slow "$@"
