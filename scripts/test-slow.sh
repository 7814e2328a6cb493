#!/usr/bin/env bash
# The tests marked `slow` (the rest of the architecture matrix and the longest engine runs): the README's test
# script with pytest's marker.
set -euo pipefail
exec bash "$(dirname "$0")/test.sh" -m slow "$@"
