"""What every `train/<method>.py` main does around its method: parse the recipe, load the target and data,
run the loop, save `final/`. The method script supplies how to build its drafter and how to report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from accelerate.utils import set_seed

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.target import FrozenTarget

from .config import config_yaml
from .config_cli import make_parser, parse_args
from .data import DataBundle, build_datasets
from .loop import LoopResult, Method, make_accelerator, run_training


def train_main(
    recipe_cls: type,
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    build_method: Callable[[Any, FrozenTarget, DataBundle], Method],
    report: Callable[[LoopResult, Method], str],
    save: Callable[[Path, Any, FrozenTarget, dict[str, Any]], Path] | None = None,
) -> int:
    """Train the drafter `build_method(cfg, target, data)` returns, as the recipe `recipe_cls` says.

    Writes the run directory (checkpoints, metrics.jsonl) and `final/` with the held-out metrics, and prints
    `report(result, method)` on the main process. `save(dir, model, target, extra)` writes `final/`
    (default: a draftsmith drafter checkpoint).
    """
    parser = make_parser(recipe_cls, prog=prog, description=description)
    parser.add_argument(
        "--resume", nargs="?", const="latest", default=None, metavar="CKPT",
        help="Continue a run: from the newest checkpoint in output_dir, or from CKPT.",
    )  # fmt: skip
    cfg: Any
    cfg, args = parse_args(recipe_cls, parser, argv)
    output_dir = Path(cfg.output_dir)
    accelerator = make_accelerator(cfg.train, cfg.log, output_dir)
    set_seed(cfg.seed)
    target = FrozenTarget.load(cfg.target, accelerator.device)
    data = build_datasets(
        cfg.data, target.tokenizer, seed=cfg.seed, progress=accelerator.is_local_main_process
    )
    method = build_method(cfg, target, data)
    method.model.to(accelerator.device)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    result = run_training(
        method, accelerator=accelerator, train_dataset=data.train, eval_dataset=data.eval, pad_id=pad_id,
        output_dir=output_dir, seed=cfg.seed, train=cfg.train, log=cfg.log, checkpoint=cfg.checkpoint,
        eval_cfg=cfg.eval, config_yaml=config_yaml(cfg), resume=args.resume,
    )  # fmt: skip
    if accelerator.is_main_process:
        summary = {
            "steps": result.step,
            "heldout": result.eval,
            "heldout_at_start": result.initial_eval,
            "train": result.last_train,
            "recipe": yaml.safe_load(config_yaml(cfg)),  # the resolved recipe (the Hub card shows it)
        }
        if save is None:
            final = save_drafter(output_dir / "final", method.model, target.identity(), {"training": summary})
        else:
            final = save(output_dir / "final", method.model, target, {"training": summary})
        print(report(result, method))
        print(f"drafter checkpoint: {final}")
    accelerator.wait_for_everyone()
    accelerator.end_training()  # after final/ is written: never inside the loop
    return 0
