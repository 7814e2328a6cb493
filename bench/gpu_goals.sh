#!/usr/bin/env bash
# The pipeline's GPU goals on one lent GPU, in about 10 minutes (docs/BENCHMARKS.md, "The pipeline on a GPU"):
#   1. `draftsmith pipeline` on TARGET (SmolLM2-135M-Instruct's directory) with PROMPTS (about 60,000 chat
#      prompts for 15M answer tokens), answers + online features + one epoch within --time-budget $BUDGET_MIN;
#   2. online EAGLE-3 training on a Llama-3.1-8B-shaped target (bench/scale_8b.py), tokens/s and peak memory;
#   3. the accelerate engines' GPU test (DDP, FSDP, ZeRO-2/3 through accelerate).
# Everything it brings back lands in OUT: summary.json (every stage's time, tokens, tokens/s), the drafter
# (final/ and its vLLM export, drafter.tar.gz), scale_8b.json and the logs.
#
#   bash bench/gpu_goals.sh TARGET PROMPTS OUT
#   PROMPTS_N=64 BUDGET_MIN=2 SHRINK=32 STEPS_8B=20 bash bench/gpu_goals.sh TARGET PROMPTS OUT   (a CPU smoke run)
set -uo pipefail
target=$1 prompts=$2 out=$3
work=${WORK:-/tmp/gpu-goals}
mkdir -p "$work" "$out"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" \
    > "$out/device.txt"

python -m draftsmith.scripts.cli pipeline --target "$target" --data "$prompts" --heldout prompts:heldout \
    --output-dir "$work/pipeline" --prompts "${PROMPTS_N:-100000}" --answer-tokens 256 --epochs 1 \
    --time-budget "${BUDGET_MIN:-6}" --eval-prompts 16 --serving-depth evaluator --export vllm --no-progress \
    data.max_len=768 >"$out/pipeline.log" 2>&1
echo "pipeline exit $?" >>"$out/pipeline.log"
cp "$work/pipeline/summary.json" "$out/" 2>/dev/null
(cd "$work/pipeline" && tar czf "$out/drafter.tar.gz" eagle3-*/final eagle3-*/metrics.jsonl export-vllm data/*.meta.json)

timeout "${LIMIT_8B:-240}" python -m bench.scale_8b --tokenizer "$target" --data "$work/pipeline/data/answers.jsonl" \
    --work "$work/scale_8b" --out "$out" --steps "${STEPS_8B:-40}" --shrink "${SHRINK:-1}" >"$out/scale_8b.log" 2>&1
echo "scale_8b exit $?" >>"$out/scale_8b.log"

timeout "${LIMIT_ENGINES:-150}" python -m pytest -q tests/recipes/test_distributed.py \
    -k test_engines_on_gpu_train_save_and_resume >"$out/engines.log" 2>&1
echo "engines exit $?" >>"$out/engines.log"
exit 0
