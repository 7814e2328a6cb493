"""The training data pipeline: read conversations, render them with the target's template, truncate, count.

    sources --read_conversations--> Conversation --render_conversation--> (input_ids, loss_mask)
            --truncate to max_len, drop samples with nothing to train--> TokenizedDataset (+ DataStats)

The train split keeps source order: the training loop's sampler owns shuffling (it must be a pure function
of seed and step for exact resume). Without explicit eval sources, a deterministic `eval_fraction` of the
train records is held out.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from draftsmith.data.chat_render import render_conversation
from draftsmith.data.conversations import FORMATS, Conversation, read_conversations

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class DataConfig:
    """Which conversations to train and evaluate on, and how to cut them."""

    train: list[str] = field(
        default_factory=lambda: ["stdlib:train"],
        metadata={
            "help": "Training sources: .jsonl/.json/.parquet/.txt files (JSON optionally .gz), save_to_disk "
            "directories, 'hf:owner/name[:split]', or 'stdlib[:train|heldout]' (the built-in corpus)."
        },
    )
    eval: list[str] = field(
        default_factory=list,
        metadata={"help": "Eval sources (same forms as `train`); empty: hold out `eval_fraction` of train."},
    )
    format: str = field(
        default="auto",
        metadata={
            "help": f"Record format of every source: 'auto' (from the keys) or one of {list(FORMATS)}."
        },
    )
    eval_fraction: float = field(
        default=0.05,
        metadata={
            "help": "Share of train records held out for eval when `eval` is empty, chosen by a hash of the "
            "record index and the seed; held-out records are never trained on, even past eval_max_samples."
        },
    )
    max_len: int = field(
        default=1024, metadata={"help": "Tokens per sample; longer samples are truncated (and counted)."}
    )
    max_samples: int | None = field(
        default=None,
        metadata={
            "help": "Read at most this many train records, in source order, before the eval hold-out "
            "(None: all). For quick runs. With data.cache: train on the cache's first this many train samples."
        },
    )
    eval_max_samples: int | None = field(
        default=200, metadata={"help": "At most this many eval samples (the first ones; None: all)."}
    )
    cache: str | None = field(
        default=None,
        metadata={
            "help": "An offline hidden-state cache directory (`draftsmith cache`): train on its samples and "
            "stored target features without loading the target's layers; the sources above are then unused."
        },
    )
    cache_verify: bool = field(
        default=True,
        metadata={
            "help": "Check every cache shard's sha256 before training; false: check each shard when training "
            "first reads it (starts at once on a large cache; a corrupt shard still stops the run)."
        },
    )

    def __post_init__(self) -> None:
        for name in ("train", "eval"):
            if isinstance(getattr(self, name), str):  # iterating a string would read one source per character
                raise ValueError(
                    f"data.{name} is a string; expected a list of sources, e.g. [{getattr(self, name)!r}]"
                )
        if not self.train:
            raise ValueError("data.train is empty; expected at least one source, e.g. ['stdlib:train']")
        if self.format != "auto" and self.format not in FORMATS:
            raise ValueError(f"data.format={self.format!r} is not known; expected 'auto' or one of {FORMATS}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} is outside [0, 1)")
        if self.max_len < 2:
            raise ValueError(f"data.max_len={self.max_len}; expected at least 2 (a token and its successor)")
        for name in ("max_samples", "eval_max_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.{name}={value}; expected None (no limit) or a count >= 1")


@dataclass
class DataStats:
    """What one split holds after rendering, truncation and dropping.

    Attributes:
        samples: samples kept.
        tokens: tokens of the kept samples (after truncation).
        trained_tokens: tokens with loss_mask 1 in the kept samples.
        truncated: samples cut to max_len (including those then dropped).
        dropped: samples left with nothing to train (no assistant token after the first position).
        max_length: longest kept sample.
    """

    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    dropped: int = 0
    max_length: int = 0

    @property
    def trained_share(self) -> float:
        """Trained tokens / all tokens (0 for an empty split)."""
        return self.trained_tokens / self.tokens if self.tokens else 0.0

    def format_table(self, title: str = "") -> str:
        """A two-column text table of the counts, headed by `title`."""
        rows = [
            ("samples", f"{self.samples:,}"),
            ("tokens", f"{self.tokens:,}"),
            ("trained tokens", f"{self.trained_tokens:,}"),
            ("trained share", f"{self.trained_share:.1%}"),
            ("truncated", f"{self.truncated:,}"),
            ("dropped (nothing to train)", f"{self.dropped:,}"),
            ("max length", f"{self.max_length:,}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [title] if title else []
        lines += [f"  {name:<{width}}  {value:>12}" for name, value in rows]
        return "\n".join(lines)


class TokenizedDataset(Dataset):
    """Rendered samples: item i is `{"input_ids": LongTensor[T], "loss_mask": BoolTensor[T]}`.

    Attributes:
        sources: `Conversation.source` of each sample, for inspection and error messages.
    """

    def __init__(self, input_ids: list[torch.Tensor], loss_masks: list[torch.Tensor], sources: list[str]):
        if not len(input_ids) == len(loss_masks) == len(sources):
            raise ValueError("input_ids, loss_masks and sources must have one entry per sample")
        self.input_ids = input_ids
        self.loss_masks = loss_masks
        self.sources = sources

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "loss_mask": self.loss_masks[index]}

    @property
    def lengths(self) -> list[int]:
        """Token count of each sample (for length-aware batching)."""
        return [len(ids) for ids in self.input_ids]


@dataclass
class DataBundle:
    """The datasets of one run and their statistics (`stats["train"]`, `stats["eval"]`).

    The datasets are `TokenizedDataset`s, or `CachedFeatureDataset`s (whose items also hold the target's
    features) when the run trains from an offline cache.
    """

    train: Any
    eval: Any
    stats: dict[str, DataStats]
    # The sha256 of each local data file the samples come from (data_content.py); None: not known (a cache
    # built before draftsmith recorded it).
    content: dict[str, str] | None = None


def load_cached_datasets(cache: Any, dtype: torch.dtype, max_samples: int | None = None) -> DataBundle:
    """The train and eval splits of an opened `FeatureCache`, features decoded to `dtype`; with `max_samples`,
    the first that many train samples only (a cache of a shuffled mix, `draftsmith data mix`, then trains on a
    smaller sample of the same mix: the scaling curve's points share one cache and one eval split)."""
    stats = {}
    for split in ("train", "eval"):
        info = cache.index["splits"].get(split, {"samples": 0, "tokens": 0, "trained_tokens": 0})
        stats[split] = DataStats(
            samples=info["samples"], tokens=info["tokens"], trained_tokens=info["trained_tokens"]
        )
    train = cache.dataset("train", dtype)
    if max_samples is not None and max_samples < len(train):
        train = train.head(max_samples)
        stats["train"] = train.stats()
    evals = cache.dataset("eval", dtype) if "eval" in cache.index["splits"] else TokenizedDataset([], [], [])
    return DataBundle(train=train, eval=evals, stats=stats, content=cache.data_sha256)


def build_datasets(
    cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, seed: int, progress: bool = True
) -> DataBundle:
    """Read, split, render and truncate the data of `cfg`.

    Args:
        cfg: the data section of the run config.
        tokenizer: the target's tokenizer (its chat template defines the rendering).
        seed: picks the held-out records when `cfg.eval` is empty.
        progress: show a tqdm bar over rendering.

    Returns:
        The train and eval datasets and their stats.

    Raises:
        ValueError: unreadable data or template problems (naming the record), or a train split left empty.
    """
    train_convs = _read_sources(cfg.train, cfg.format, cfg.max_samples)
    if cfg.eval:
        eval_convs = _read_sources(cfg.eval, cfg.format, cfg.eval_max_samples)
    else:
        train_convs, eval_convs = split_heldout(train_convs, cfg.eval_fraction, seed)
        eval_convs = eval_convs[: cfg.eval_max_samples]
    train, train_stats = tokenize_conversations(train_convs, tokenizer, cfg.max_len, "train", progress)
    evals, eval_stats = tokenize_conversations(eval_convs, tokenizer, cfg.max_len, "eval", progress)
    if len(train) == 0:
        raise ValueError(
            f"no training samples are left from {cfg.train}: {train_stats.dropped} of {len(train_convs)} had no "
            "trained token within max_len; check that the data has assistant turns and max_len is large enough"
        )
    for name, stats in (("train", train_stats), ("eval", eval_stats)):
        logger.info("data %s:\n%s", name, stats.format_table())
    return DataBundle(train=train, eval=evals, stats={"train": train_stats, "eval": eval_stats})


def tokenize_conversations(
    convs: Sequence[Conversation],
    tokenizer: PreTrainedTokenizerBase,
    max_len: int,
    desc: str = "render",
    progress: bool = True,
) -> tuple[TokenizedDataset, DataStats]:
    """Render each conversation, truncate it to `max_len` tokens, and drop those with nothing to train.

    A sample is dropped when no token after the first is trained: the first token is never predicted (a
    causal LM's targets are tokens 1..T-1), so such a sample adds no loss.
    """
    ids_out, masks_out, sources = [], [], []
    stats = DataStats()
    for conv in tqdm(convs, desc=f"render {desc}", unit="conv", disable=not progress):
        sample = render_conversation(tokenizer, conv)
        ids, mask = sample.input_ids, sample.loss_mask
        if len(ids) > max_len:
            ids, mask = ids[:max_len], mask[:max_len]
            stats.truncated += 1
        if not any(mask[1:]):
            stats.dropped += 1
            continue
        ids_out.append(torch.tensor(ids, dtype=torch.long))
        masks_out.append(torch.tensor(mask, dtype=torch.bool))
        sources.append(conv.source)
        stats.samples += 1
        stats.tokens += len(ids)
        stats.trained_tokens += sum(mask)
        stats.max_length = max(stats.max_length, len(ids))
    return TokenizedDataset(ids_out, masks_out, sources), stats


def split_heldout(items: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """Split `items` into (kept, held out), each in the original order.

    Item i is held out when sha256(f"{seed}:{i}"), read as a number in [0, 1), is below `fraction`: stable
    across processes and Python versions (unlike the salted built-in hash()). When `fraction` > 0 and there
    are at least two items, at least one item is held out and one kept.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"eval fraction {fraction} is outside [0, 1)")
    if fraction == 0.0 or len(items) < 2:
        return list(items), []
    u = [int(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:16], 16) / 2**64 for i in range(len(items))]
    held = [x < fraction for x in u]
    if not any(held):
        held[min(range(len(u)), key=u.__getitem__)] = True
    elif all(held):
        held[max(range(len(u)), key=u.__getitem__)] = False
    kept = [item for item, h in zip(items, held, strict=True) if not h]
    return kept, [item for item, h in zip(items, held, strict=True) if h]


def tokens_view(dataset: Any) -> Any:
    """`dataset` for reading token ids only: an offline cache's `tokens_only()` view (no features decoded), or
    the dataset itself."""
    tokens_only = getattr(dataset, "tokens_only", None)
    return tokens_only() if tokens_only is not None else dataset


def sample_lengths(dataset: Any) -> list[int]:
    """Each sample's token count."""
    dataset = tokens_view(dataset)
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def collate(samples: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad samples to the longest one.

    Returns:
        `input_ids` [B, T] long (pad_id on padding), `attention_mask` [B, T] long (0 on padding) and
        `loss_mask` [B, T] bool (False on padding). Any other per-token entry (an offline cache's features,
        `[T, H]`) is stacked to `[B, T, H]` with zeros on padding.
    """
    if not samples:
        raise ValueError("collate got an empty batch; expected at least one sample")
    longest = max(len(s["input_ids"]) for s in samples)
    input_ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), longest), dtype=torch.bool)
    extra = {
        k: torch.zeros((len(samples), longest, *v.shape[1:]), dtype=v.dtype)
        for k, v in samples[0].items()
        if k not in ("input_ids", "loss_mask")
    }
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        input_ids[row, :n] = sample["input_ids"]
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = sample["loss_mask"]
        for k, v in extra.items():
            v[row, :n] = sample[k]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, **extra}


def _read_sources(sources: list[str], format: str, limit: int | None) -> list[Conversation]:
    """All conversations of `sources` in order, at most `limit` in total."""
    convs: list[Conversation] = []
    for source in sources:
        remaining = None if limit is None else limit - len(convs)
        if remaining == 0:
            break
        convs += read_conversations(source, format=format, limit=remaining)
    return convs
