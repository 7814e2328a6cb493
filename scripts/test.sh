#!/usr/bin/env bash
# Install draftsmith with its test tools (CPU torch) and run the test suite; tests marked `slow` (the rest of
# the architecture matrix) run with `bash scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" -e ".[dev]"
python -m pytest -q --durations=15 -m "not slow" "$@"
