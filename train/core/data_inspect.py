"""See what the drafter will train on: rendered samples with the trained tokens highlighted, plus stats.

Backs `draftsmith data inspect --config ...`. Reading the rendered text is the fastest way to catch a wrong
chat template, a loss mask that covers the prompt, or a double BOS before spending a training run on it.
"""

from __future__ import annotations

import itertools
from typing import cast

from transformers import PreTrainedTokenizerBase

from .data import DataConfig, build_datasets

TRAINED_ANSI = ("\x1b[42m\x1b[30m", "\x1b[0m")  # black on green
TRAINED_PLAIN = ("«", "»")


def highlight_trained(
    tokenizer: PreTrainedTokenizerBase, input_ids: list[int], loss_mask: list[int], color: bool = False
) -> str:
    """Decode `input_ids` with each run of trained tokens wrapped in markers.

    Args:
        tokenizer: decodes the ids (special tokens are kept visible).
        input_ids: one sample's ids.
        loss_mask: 1/True where the token is trained.
        color: ANSI green background for trained runs; otherwise `«` and `»` around them.

    Returns:
        The decoded text. Runs are decoded separately, so a multi-byte character split across a run
        boundary shows as a replacement character.
    """
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask {len(loss_mask)}")
    start, end = TRAINED_ANSI if color else TRAINED_PLAIN
    parts = []
    pairs = zip(input_ids, loss_mask, strict=True)
    for trained, run in itertools.groupby(pairs, key=lambda pair: bool(pair[1])):
        text = cast(str, tokenizer.decode([token for token, _ in run], skip_special_tokens=False))
        parts.append(f"{start}{text}{end}" if trained else text)
    return "".join(parts)


def inspect_data(
    cfg: DataConfig,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    num_samples: int = 3,
    color: bool = False,
) -> str:
    """The first `num_samples` training samples, rendered and highlighted, then the train and eval stats.

    Args:
        cfg: the data config to inspect (the whole data set is rendered, for the stats).
        tokenizer: the target's tokenizer.
        seed: the run seed (it decides which records are held out for eval).
        num_samples: how many training samples to show.
        color: ANSI colors (for a terminal) instead of `«»` markers.

    Returns:
        A multi-line report.
    """
    bundle = build_datasets(cfg, tokenizer, seed, progress=False)
    lines = []
    for i in range(min(num_samples, len(bundle.train))):
        sample = bundle.train[i]
        ids, mask = sample["input_ids"].tolist(), sample["loss_mask"].tolist()
        lines.append(f"=== {bundle.train.sources[i]} ({len(ids)} tokens, {sum(mask)} trained) ===")
        lines.append(highlight_trained(tokenizer, ids, mask, color))
        lines.append("")
    lines.append(bundle.stats["train"].format_table("train"))
    lines.append(bundle.stats["eval"].format_table("eval"))
    return "\n".join(lines)
