#!/usr/bin/env bash
# Install draftsmith with its test tools (CPU torch) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" -e ".[dev]"
python -m pytest -q --durations=15 "$@"
