"""Build a toy target: a small Llama trained from scratch on CPU, deterministically (DESIGN.md section 4).

Machines without network access cannot download a real target, so draftsmith trains its own: a byte-level
BPE tokenizer with a chat template (toy/tokenizer.py) and a `LlamaForCausalLM` pre-trained on
packed blocks of rendered conversations. The default corpus is the standard library's source
(data/stdlib_corpus.py: user = signature + docstring, assistant = body), held out by module.

The output is a normal Hugging Face directory (config, safetensors, tokenizer with chat template,
generation_config) plus `build.json`, which records what was built and how well it trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import torch
import transformers
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from draftsmith.data.stdlib_corpus import Split, stdlib_conversations
from draftsmith.runtime.files import atomic_dir, write_json
from draftsmith.toy.presets import MAX_POSITIONS, PRESETS, ToyPreset
from draftsmith.toy.tokenizer import END_TOKEN, SPECIAL_TOKENS, render_chat, train_tokenizer

logger = logging.getLogger(__name__)

HELDOUT_PERCENT = 5  # records of a non-stdlib corpus held out (the stdlib corpus holds out whole modules)


@dataclass
class _Corpus:
    train_texts: list[str]  # rendered conversations / documents, each ending with END_TOKEN
    heldout_texts: list[str]


def build_toy_target(
    preset: str,
    out_dir: Path,
    corpus: Sequence[str] | None = None,
    seed: int = 0,
    force: bool = False,
    max_steps: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train a toy target and save it as a Hugging Face directory.

    Args:
        preset: a key of PRESETS.
        out_dir: where the model goes; written via a temporary sibling and renamed at the end, so a killed
            build leaves no half-written directory.
        corpus: sources: "stdlib" (the default; held out by module) and/or conversation or text files
            readable by `draftsmith.data.conversations.read_conversations` (about 5% of records held out).
        seed: seeds the initialisation and the batch order; the same seed on the same machine gives
            bit-identical weights.
        force: replace an existing non-empty `out_dir`.
        max_steps: override the preset's step count (tests use a few steps); warm-up scales with it.
        progress: show a tqdm bar with the loss.

    Returns:
        The contents of `out_dir/build.json`.
    """
    start = time.perf_counter()
    cfg = _preset(preset, max_steps)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, force)
    sources = list(corpus) if corpus else ["stdlib"]
    data = _load_corpus(sources)
    tokenizer, train_ids, heldout_ids = _tokenize(data, cfg, sources)

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_model_config(cfg, tokenizer))
    losses, train_time = _train(model, train_ids, cfg, seed, progress)
    heldout_loss = _heldout_loss(model, heldout_ids, cfg)  # None without held-out text

    info = {
        "preset": preset,
        "preset_values": dataclasses.asdict(cfg),
        "corpus": sources,
        "seed": seed,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "num_train_conversations": len(data.train_texts),
        "num_heldout_conversations": len(data.heldout_texts),
        "train_tokens": train_ids.numel(),
        "heldout_tokens": heldout_ids.numel(),
        "train_tokens_seen": cfg.max_steps * cfg.batch_size * cfg.seq_len,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "train_time_s": round(train_time, 1),
        "initial_train_loss": losses[0],
        "train_loss": sum(losses[-20:]) / len(losses[-20:]),
        "heldout_loss": heldout_loss,
        "python_version": sys.version.split()[0],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    _save(model, tokenizer, info, out_dir, force)
    return info


def _preset(preset: str, max_steps: int | None) -> ToyPreset:
    """The preset named `preset`, shortened to `max_steps` when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    cfg = PRESETS[preset]
    if max_steps is not None:
        # A shortened build keeps the schedule's shape: warm-up stays the same fraction of the run.
        warmup = max(1, round(cfg.warmup_steps * max_steps / cfg.max_steps))
        cfg = dataclasses.replace(cfg, max_steps=max_steps, warmup_steps=min(warmup, max_steps))
    return cfg


def _tokenize(
    data: _Corpus, cfg: ToyPreset, sources: list[str]
) -> tuple[PreTrainedTokenizerFast, torch.Tensor, torch.Tensor]:
    """A BPE tokenizer trained on the training texts, and both splits encoded with it."""
    # The BPE trainer would otherwise learn merges across special-token boundaries (")<|"), which the
    # encoder never produces because it splits special tokens off first: wasted vocabulary.
    tokenizer = train_tokenizer(_split_special(data.train_texts), cfg.vocab_size)
    train_ids = _encode(tokenizer, data.train_texts)
    heldout_ids = _encode(tokenizer, data.heldout_texts)
    if train_ids.numel() < cfg.seq_len:
        raise ValueError(
            f"corpus {sources} has {train_ids.numel()} training tokens; expected at least seq_len="
            f"{cfg.seq_len}. Add data or use another corpus."
        )
    return tokenizer, train_ids, heldout_ids


def greedy_samples(model_dir: Path, n: int = 3, max_new_tokens: int = 128) -> list[tuple[str, str]]:
    """Greedy answers of a built target to the first `n` held-out stdlib prompts.

    Args:
        model_dir: a directory written by `build_toy_target`.
        n: number of prompts.
        max_new_tokens: generation stops here or at the end-of-turn token.

    Returns:
        (prompt, completion) pairs: the user message (signature + docstring) and the decoded answer.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    samples = []
    for conv in stdlib_conversations("heldout")[:n]:
        user = conv["messages"][0]
        text = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
        inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        completion = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        samples.append((user["content"], str(completion)))
    return samples


def _check_out_dir(out_dir: Path, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output path {out_dir} is a file; expected a directory. Choose another --out.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ValueError(
            f"output directory {out_dir} already exists and is not empty; pass --force (force=True) to "
            "replace it, or choose another --out"
        )


def _load_corpus(sources: list[str]) -> _Corpus:
    """Render every source into training and held-out texts (in source order, deterministic)."""
    # The chat template does not depend on the vocabulary: render with the smallest tokenizer there is.
    renderer = train_tokenizer([], 256 + len(SPECIAL_TOKENS) + 1)
    data = _Corpus([], [])
    for source in sources:
        if source == "stdlib":
            splits: tuple[tuple[Split, list[str]], ...] = (
                ("train", data.train_texts),
                ("heldout", data.heldout_texts),
            )
            for split, texts in splits:
                texts.extend(render_chat(renderer, c["messages"]) for c in stdlib_conversations(split))
            continue
        from draftsmith.data.conversations import read_conversations  # lazy: optional data readers

        for conv in read_conversations(source):
            if conv.text is not None:
                text = conv.text + END_TOKEN  # documents are separated like turns
            else:
                try:
                    text = render_chat(renderer, conv.messages)
                except jinja2.TemplateError as err:
                    raise ValueError(
                        f"{conv.source}: the toy chat template cannot render this conversation ({err}); "
                        "expected roles system/user/assistant/tool. Fix or drop the record."
                    ) from err
            held = int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT
            (data.heldout_texts if held else data.train_texts).append(text)
    if not data.train_texts:
        raise ValueError(f"corpus {sources} yielded no training text; expected conversations or documents")
    return data


def _split_special(texts: list[str]) -> Iterator[str]:
    pattern = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
    for text in texts:
        yield from (piece for piece in pattern.split(text) if piece)


def _encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts tokenized and concatenated: [N] int64."""
    if not texts:
        return torch.zeros(0, dtype=torch.long)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return torch.tensor([t for row in ids for t in row], dtype=torch.long)


def _model_config(cfg: ToyPreset, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        # Tied: at this size the embedding is a large share of the parameters.
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,  # None: the chat format has no BOS token
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _lr_lambda(cfg: ToyPreset) -> Any:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _batches(blocks: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless batches [B, T]: each epoch visits every block once, in a seeded random order."""
    order = torch.zeros(0, dtype=torch.long)
    while True:
        while order.numel() < batch_size:
            order = torch.cat([order, torch.randperm(blocks.shape[0], generator=generator)])
        yield blocks[order[:batch_size]]
        order = order[batch_size:]


def _train(
    model: LlamaForCausalLM, ids: torch.Tensor, cfg: ToyPreset, seed: int, progress: bool
) -> tuple[list[float], float]:
    """AdamW + warm-up + cosine, fp32, grad-norm clip 1.0. Returns (per-step losses, seconds)."""
    start = time.perf_counter()
    n_blocks = ids.numel() // cfg.seq_len
    blocks = ids[: n_blocks * cfg.seq_len].view(n_blocks, cfg.seq_len)  # [N] -> [blocks, T]
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.get_input_embeddings().weight]
    no_decay = [p for p in model.parameters() if not any(p is q for q in decay)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
    batches = _batches(blocks, cfg.batch_size, torch.Generator().manual_seed(seed))
    model.train()
    # One preallocated buffer, not a list of 0-d tensors: thousands of small long-lived allocations between
    # the large per-step activations fragment glibc's heap, and RSS then grows by ~15 MB per step.
    losses = torch.zeros(cfg.max_steps)
    bar = tqdm(range(cfg.max_steps), desc="toy target", disable=not progress, dynamic_ncols=True)
    for step in bar:
        batch = next(batches)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        if progress and (step % 10 == 0 or step == cfg.max_steps - 1):  # host sync only when shown
            bar.set_postfix(loss=f"{losses[max(0, step - 9) : step + 1].mean().item():.3f}")
    model.eval()
    return losses.tolist(), time.perf_counter() - start


@torch.no_grad()
def _heldout_loss(model: LlamaForCausalLM, ids: torch.Tensor, cfg: ToyPreset) -> float | None:
    """Mean next-token cross-entropy over the first `cfg.heldout_blocks` packed held-out blocks."""
    rows = list(ids[: cfg.heldout_blocks * cfg.seq_len].split(cfg.seq_len))  # the last may be shorter
    full = [r for r in rows if r.numel() == cfg.seq_len]
    batches = [torch.stack(full[i : i + cfg.batch_size]) for i in range(0, len(full), cfg.batch_size)]
    batches += [r[None] for r in rows if 2 <= r.numel() < cfg.seq_len]
    total, count = 0.0, 0
    for batch in batches:
        logits = model(input_ids=batch).logits.float()  # [B, T, V]
        total += torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
        ).item()
        count += batch[:, 1:].numel()
    return total / count if count else None


def _save(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    info: dict[str, Any],
    out_dir: Path,
    force: bool,
) -> None:
    """Write to `<out_dir>.tmp`, then swap it in, so `out_dir` is never half-written."""
    _check_out_dir(out_dir, force)  # again: the directory may have appeared while we trained
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    with atomic_dir(out_dir) as tmp:  # a leftover from a killed build is cleared
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "build.json", info)
