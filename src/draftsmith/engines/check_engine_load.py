"""Closed loop: load our EAGLE-3 vLLM export with the engine ecosystem's own model code and compare forwards.

    python -m draftsmith.engines.check_engine_load --checkpoint CKPT --export DIR \
        --engine-python /path/to/speculators-venv/bin/python [--target DIR] [--tokens 48]

vLLM's EAGLE-3 format is defined by the `speculators` package (vLLM reads `speculators_model_type: eagle3`
configs, and speculators' `Eagle3DraftModel` is the reference implementation of that format). speculators
pins its own transformers range, so it lives in its own virtual environment (bench/bench_peers.py has the
install recipe) and this file runs twice:

1. draftsmith side (this environment): load the checkpoint and its target, take real text, capture the
   target's features at the drafter's layers, run draftsmith's training-time-test unroll, and save inputs
   and draftsmith's logits of every step.
2. engine side (`engine` subcommand, run with the venv's python; imports only torch, safetensors and
   speculators): load the EXPORT directory with `Eagle3DraftModel.from_pretrained`, give it the target's
   embedding (vLLM shares the target's when the export has none), run the same sample through speculators'
   own data path (shift_batch + CollateFn), capture the draft logits of every step, and compare.

Prints one JSON line `{"max_abs_diff": ..., "per_step": [...], ...}`; exits 1 above --tolerance (1e-4).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TOLERANCE = 1e-4


def engine_side(export_dir: str, inputs_file: str, tolerance: float) -> dict[str, Any]:
    """Run in the speculators environment: load the export with speculators' classes and compare logits."""
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn

    torch.set_num_threads(1)
    data = load_file(inputs_file)
    config = Eagle3DraftModel.config_class.from_pretrained(export_dir)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(export_dir, config=config).float().eval()
    with torch.no_grad():  # the export has no embed_tokens: the engine shares the target's
        model.embed_tokens.weight.copy_(data["embedding"])
    ids, features = data["input_ids"], data["features"]
    T = ids.shape[0]
    sample = {
        "hidden_states": features,
        "input_ids": ids,
        "loss_mask": torch.ones(T, dtype=torch.long),
        "verifier_last_hidden_states": torch.zeros(T, model.hidden_size),
        "lengths": torch.tensor([T]),
        "position_ids": torch.arange(T),
    }
    batch = CollateFn(T - 1, model.hidden_size, 3, torch.float32, shift_batch)([sample])
    steps = data["expected"].shape[0]
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.detach().float()))
    with torch.no_grad():
        model(
            hidden_states=batch["hidden_states"],
            input_ids=batch["input_ids"],
            document_ids=batch["document_ids"],
            position_ids=batch["position_ids"],
            ttt_steps=steps,
        )
    hook.remove()
    per_step = []
    for s in range(steps):
        valid = T - 1 - s  # columns whose shifted tokens are real in both implementations
        ours, theirs = data["expected"][s, :valid], logits[s].reshape(-1, logits[s].shape[-1])[:valid]
        per_step.append(float((ours - theirs).abs().max()))
    from importlib.metadata import version

    worst = max(per_step)
    return {
        "engine": "speculators",
        "speculators_version": version("speculators"),
        "transformers_version": version("transformers"),
        "steps": steps,
        "tokens": T,
        "d2t_equal": bool(torch.equal(model.d2t.cpu().long(), data["d2t"])),
        "per_step": per_step,
        "max_abs_diff": worst,
        "tolerance": tolerance,
        "ok": worst <= tolerance and bool(torch.equal(model.d2t.cpu().long(), data["d2t"])),
    }


def sample_ids(tokenizer: Any, tokens: int) -> Any:
    """`[1, tokens]` ids of real text every machine has (this file's own source)."""
    import torch

    return torch.tensor([tokenizer(Path(__file__).read_text())["input_ids"][:tokens]])


def prepare_inputs(checkpoint: str, target_path: str | None, tokens: int, out_file: Path) -> dict[str, Any]:
    """draftsmith side: real text through the target and draftsmith's unroll; save inputs and logits."""
    import torch
    from safetensors.torch import save_file

    from draftsmith.models.checkpoint import load_drafter, read_drafter_config
    from draftsmith.models.target import FrozenTarget, TargetConfig

    saved = read_drafter_config(checkpoint)
    if saved["kind"] != "eagle3":
        raise ValueError(
            f"{checkpoint}: the closed loop checks EAGLE-3 exports; this is a {saved['kind']} drafter"
        )
    target = FrozenTarget.load(
        TargetConfig(path=target_path or saved["target"]["name_or_path"], dtype="float32")
    )
    draft, _ = load_drafter(checkpoint, target)
    draft = draft.float()
    ids = sample_ids(target.tokenizer, tokens)
    feats, _ = target.forward(ids, layer_ids=draft.feature_layers)
    g = torch.cat([feats[k] for k in draft.feature_layers], dim=-1)
    with torch.no_grad():
        steps = draft.unroll(g, ids)
    T = ids.shape[1]
    expected = torch.stack([s[0, : T - 1] for s in steps]).float().contiguous()
    save_file(
        {
            "input_ids": ids[0].contiguous(),
            "features": g[0].float().contiguous(),
            "expected": expected,
            "embedding": target.embed_tokens.weight.detach().float().contiguous(),
            "d2t": draft.d2t.long().contiguous(),
        },
        str(out_file),
    )
    return {"tokens": T, "steps": len(steps)}


def run_closed_loop(
    checkpoint: str,
    export_dir: str,
    engine_python: str,
    target: str | None = None,
    tokens: int = 48,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Both sides; returns the engine side's report."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "inputs.safetensors"
        prepare_inputs(checkpoint, target, tokens, inputs)
        proc = subprocess.run(
            [
                engine_python,
                str(Path(__file__).resolve()),
                "engine",
                "--export",
                export_dir,
                "--inputs",
                str(inputs),
                "--tolerance",
                str(tolerance),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"the engine side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["engine"]:
        p = argparse.ArgumentParser(prog="check_engine_load.py engine")
        p.add_argument("--export", required=True)
        p.add_argument("--inputs", required=True)
        p.add_argument("--tolerance", type=float, default=TOLERANCE)
        a = p.parse_args(argv[1:])
        report = engine_side(a.export, a.inputs, a.tolerance)
        print(json.dumps(report))
        return 0 if report["ok"] else 1
    p = argparse.ArgumentParser(
        prog="python -m draftsmith.engines.check_engine_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="the draftsmith EAGLE-3 checkpoint that was exported")
    p.add_argument("--export", required=True, help="its `draftsmith export --to vllm` directory")
    p.add_argument(
        "--engine-python", required=True, help="python of the environment with speculators installed"
    )
    p.add_argument("--target", default=None, help="target directory (default: the checkpoint's)")
    p.add_argument("--tokens", type=int, default=48, help="tokens of real text to run (default 48)")
    p.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="max abs logit difference (default 1e-4)"
    )
    a = p.parse_args(argv)
    report = run_closed_loop(a.checkpoint, a.export, a.engine_python, a.target, a.tokens, a.tolerance)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
