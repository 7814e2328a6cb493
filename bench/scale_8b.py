r"""Online EAGLE-3 training on a target shaped like Llama-3.1-8B (docs/BENCHMARKS.md, "The pipeline on a GPU: not measured yet"): its
real config (32 layers, hidden 4096, GQA 32/8, MLP 14336, vocab 128,256) with random bfloat16 weights, the
target run at every step (no cache), as `draftsmith train eagle` does; tokens/s and peak GPU memory.

    python -m bench.scale_8b --tokenizer SMOLLM2_DIR --data answers.jsonl --work /tmp/s8 --out OUT [--steps 60]
    python -m bench.scale_8b ... --shrink 16          a CPU smoke run: every width / 16, 8 layers

The tokenizer is borrowed (SmolLM2's: its 49,152 ids lie inside the 128,256 rows), since no Llama tokenizer
can be downloaded here; the cost of a step does not depend on which ids it reads. Writes OUT/scale_8b.json:
the config, the steps, the median tokens/s and seconds a step over the logged windows after the first, and
the peak GPU memory training logged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LLAMA_31_8B: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_target(out: Path, tokenizer: Path, shrink: int) -> dict[str, Any]:
    """Llama-3.1-8B's config (every width divided by `shrink`, the depth too down to 8 layers) with random weights, saved in
    bfloat16 beside the borrowed tokenizer's files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(LLAMA_31_8B)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        shape[key] = max(1, shape[key] // shrink)
    shape["num_hidden_layers"] = max(8, shape["num_hidden_layers"] // shrink)  # EAGLE-3: 2 < L//2 < L-3
    config = LlamaConfig(**shape, dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: 16 GB, not float32's 32
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, out / name)
    (out / "build.json").write_text(json.dumps({"shape": "llama-3.1-8b", "shrink": shrink}))
    del model
    return shape


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="a target directory whose tokenizer is borrowed"
    )
    p.add_argument("--data", required=True, help="chats to train on (the pipeline's answers)")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument(
        "--shrink",
        type=int,
        default=1,
        help="divide the widths and the depth, to 8 layers at least (a CPU smoke run)",
    )
    args = p.parse_args()

    from draftsmith.train import eagle

    target = args.work / "target"
    began = time.perf_counter()
    shape = build_target(target, args.tokenizer, args.shrink)
    built_s = time.perf_counter() - began
    run = args.work / "run"
    settings = [
        f"target.path={target}",
        "target.dtype=bfloat16",
        f"data.train=[{args.data}]",
        f"output_dir={run}",
    ]
    settings += [f"train.max_steps={args.steps}", f"train.micro_batch_size={args.micro_batch}"]
    settings += [
        f"data.max_len={args.max_len}",
        "train.mixed_precision=bf16",
        "log.every=10",
        "checkpoint.every=0",
    ]
    settings += [
        "draft.layer_init=random",
        "draft.copy_attention=0",
        "eval.every=0",
        "data.eval_max_samples=8",
    ]
    began = time.perf_counter()
    code = eagle.main(["--config", "recipes/eagle/eagle3_smollm2.yaml", *settings])
    wall = time.perf_counter() - began
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "perf/step_s" in r]
    later = train[1:] or train
    result = {
        "exit": code,
        "shape": shape,
        "build_s": round(built_s, 1),
        "train_wall_s": round(wall, 1),
        "steps": args.steps,
        "micro_batch": args.micro_batch,
        "max_len": args.max_len,
        "tokens_per_s": statistics.median(r["perf/tokens_per_s"] for r in later),
        "step_s": statistics.median(r["perf/step_s"] for r in later),
        "peak_gpu_gib": max(
            (r["perf/peak_gpu_gib"] for r in train if "perf/peak_gpu_gib" in r), default=None
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_8b.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
