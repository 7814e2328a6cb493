"""`draftsmith data regenerate --target DIR`: the target's answers generated here, by transformers' `generate`.

Conversations go in batches of `--batch-size`. Turn k of every conversation in a batch is generated in one
`generate` call (KV cache, left padding), each conditioned on its own conversation's earlier answers. A batch
draws from a seed of its own (a function of `--seed` and its first index), so a resumed run redraws it alike;
its rows are appended to OUT (data/regen_output.py) when the whole batch is done.

Batches are cut from windows of SORT_WINDOW batches in input order, each window sorted by the conversations'
length: left padding to the longest prompt of a batch costs a forward over every pad, and real prompts range
from a line to thousands of tokens. Within a window the rows are written shortest first; across windows
the input order holds, so the first N rows of OUT are still about the first N conversations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, GenerationConfig, LogitsProcessorList, StaticCache

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import Conversation, prompt_turns, read_conversations, with_answers
from draftsmith.data.nucleus import DrawnToken
from draftsmith.data.regen_output import (
    RegenOutput,
    RowWriter,
    Sampling,
    data_record,
    new_counts,
    run_meta,
)
from draftsmith.models.growing_cache import growing_cache
from draftsmith.models.parts import with_cache
from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
from draftsmith.runtime.tokens import left_pad

from .regenerate_settings import RegenerateArgs

COUNT_KEYS = ("answers", "truncated", "completion_tokens")
SORT_WINDOW = 16  # batches per length-sorted window
# A compiled run's static cache is as long as the batch's prompt plus its answers, rounded up to a multiple of
# this: every distinct length is a graph of its own to compile, and a batch's widest prompt varies.
STATIC_CACHE_STEP = 256


@dataclass
class Generator:
    """The loaded target as `generate` uses it: the tokens that end an answer, the positions it can read."""

    model: Any
    tokenizer: Any
    stop_ids: set[int]
    max_positions: int
    sampling: Sampling
    compiled: bool = False  # generate with a static cache and torch.compile (`--compile`)


@dataclass
class Answering:
    """One conversation of a batch: the prompt of each user turn, the answers so far, the tokens they took, how
    many were cut at --max-new-tokens, and why it failed (None while it has not)."""

    prompts: list[list[dict[str, Any]]]
    answers: list[str] = field(default_factory=list)
    tokens: int = 0
    truncated: int = 0
    failure: str | None = None


def regenerate_locally(settings: RegenerateArgs) -> dict[str, Any]:
    """Regenerate with transformers' `generate` on this machine; returns the counts."""
    RegenOutput(settings.out, {}, []).check(settings.data)  # before the target is loaded
    convs = read_conversations(settings.data, settings.format, settings.max_samples)
    target = load_target(settings)
    generator = generator_for(target, settings)
    dtype = str(target.model.dtype).removeprefix("torch.")  # recorded, not checked on resume
    data = data_record(settings.data, settings.format, convs)
    output = RegenOutput(
        settings.out, run_meta(settings.sampling, target.identity(), data, dtype=dtype), convs
    )
    done = output.resume(settings.retry_failed)
    todo = [i for i in range(len(convs)) if i not in done]
    counts = new_counts(len(convs), len(todo), COUNT_KEYS)
    began = time.perf_counter()
    bar = tqdm(total=len(todo), desc="regenerate", unit="conv", disable=settings.no_progress)
    with output.appending() as writer:
        try:
            for batch in length_batches(convs, settings.batch_size, done):
                write_batch(writer, convs, answer_batch(generator, convs, batch, settings.seed), counts)
                writer.flush()
                bar.update(len(batch))
        except KeyboardInterrupt:  # the batch being generated is dropped; every finished one is kept
            counts["interrupted"] = True
    bar.close()
    counts["seconds"] = time.perf_counter() - began
    output.finish(counts)  # raises Interrupted after Ctrl-C
    assert counts["written"] + counts["failed"] + counts["skipped"] == counts["input"]
    return counts


def length_batches(convs: list[Conversation], size: int, done: set[int]) -> list[list[int]]:
    """The conversations not `done`, in batches of at most `size`: each window of SORT_WINDOW batches (in input
    order) sorted by the conversations' length in characters, so a batch pads its prompts to about their own
    length. The batches are cut over all conversations and then the done ones left out, so a resumed run
    generates the batches it had not finished exactly as the first run would have."""

    def length(i: int) -> int:
        return sum(len(str(m.get("content") or "")) for m in convs[i].messages)

    window = size * SORT_WINDOW
    indices = range(len(convs))
    order = [i for w in range(0, len(convs), window) for i in sorted(indices[w : w + window], key=length)]
    cut = (order[k : k + size] for k in range(0, len(order), size))
    return [kept for batch in cut if (kept := [i for i in batch if i not in done])]


def load_target(settings: RegenerateArgs) -> FrozenTarget:
    """The target on `--device` in `--dtype`, generating with nothing but what `generate_batch` passes."""
    assert settings.target is not None  # regenerate() sends only --target runs here
    device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = TargetConfig(
        path=settings.target, dtype=settings.dtype, trust_remote_code=settings.trust_remote_code
    )
    target = FrozenTarget.load(config, device)
    target.model.generation_config = (
        GenerationConfig()
    )  # only the settings passed below, never a repo's defaults
    return target


def generator_for(target: FrozenTarget, settings: RegenerateArgs) -> Generator:
    """What `generate` needs of the target; a target whose answers would never end is refused."""
    stop_ids = stop_token_ids(target)
    if not stop_ids:
        raise ValueError(
            f"target {settings.target!r} has no end-of-sequence token (tokenizer eos_token_id or generation_config "
            "eos_token_id): answers would never end; set one in the target's generation_config.json"
        )
    max_positions = int(getattr(target.model.config, "max_position_embeddings", 1 << 30))
    compiled = compile_answers(settings.compile, target.model.device)
    return Generator(target.model, target.tokenizer, stop_ids, max_positions, settings.sampling, compiled)


def compile_answers(choice: str, device: torch.device) -> bool:
    """Whether `--compile` (auto, on, off) generates with a static cache and torch.compile: auto compiles on a
    GPU only, where CUDA graphs take the launch cost of each small decoding step away; on a CPU the compiled
    step was no faster (docs/BENCHMARKS.md, "Compiled or not, stage by stage")."""
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def unanswerable(conv: Conversation, prompts: list[list[dict[str, Any]]]) -> str | None:
    """Why `conv` cannot be regenerated before anything is generated, or None."""
    if not prompts:
        return "no user turn (a text document or an assistant-only record)"
    if any(m["role"] == "tool" for m in conv.messages):
        return "has tool messages: their results cannot be regenerated"
    return None


def answer_batch(
    generator: Generator, convs: list[Conversation], batch: list[int], seed: int
) -> dict[int, Answering]:
    """Every user turn of the conversations `batch` indexes, turn k of all of them generated together."""
    states = {i: Answering(prompt_turns(convs[i])) for i in batch}
    for i, state in states.items():
        state.failure = unanswerable(convs[i], state.prompts)
    torch.manual_seed(seed * 1_000_003 + batch[0])  # a resumed run redraws the same batch
    for turn in range(max((len(s.prompts) for s in states.values()), default=0)):
        answer_turn(generator, convs, states, turn)
    return states


def answer_turn(
    generator: Generator, convs: list[Conversation], states: dict[int, Answering], turn: int
) -> None:
    """Turn `turn` of each conversation still going, rendered after its own answers, in one `generate`; a
    prompt that leaves no room for --max-new-tokens fails its conversation."""
    live, ids = [], []
    new_tokens, max_positions = generator.sampling.max_new_tokens, generator.max_positions
    for i, state in states.items():
        if state.failure is not None or turn >= len(state.prompts):
            continue
        messages = with_answers(state.prompts[turn], state.answers)
        prompt = render_prompt(generator.tokenizer, messages, convs[i].tools)
        if len(prompt) + new_tokens > max_positions:
            state.failure = f"prompt of {len(prompt)} tokens + {new_tokens} new > {max_positions}"
            continue
        live.append(state)
        ids.append(prompt)
    if not live:
        return
    with torch.no_grad():
        new = generate_batch(
            generator.model,
            generator.tokenizer,
            ids,
            generator.sampling,
            generator.stop_ids,
            compiled=generator.compiled,
        )
    for state, (tokens, stopped) in zip(live, new, strict=True):
        state.answers.append(generator.tokenizer.decode(tokens, skip_special_tokens=True).strip())
        state.tokens += len(tokens)
        state.truncated += not stopped


def generate_batch(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    sampling: Sampling,
    stop_ids: set[int],
    compiled: bool = False,
) -> list[tuple[list[int], bool]]:
    """New token ids for each prompt (the stop token and what follows cut off), left-padded in one batch, and
    whether a stop token ended it (False: cut at max_new_tokens). `compiled`: with transformers' static cache
    and its torch.compile of the decoding step (`compiled_cache`)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids)
    ids, mask = left_pad(prompts, pad, model.device)
    width = ids.shape[1]
    drawn = (
        []
        if sampling.temperature == 0
        else [DrawnToken(sampling.temperature, sampling.top_p, sampling.top_k)]
    )
    room = width + sampling.max_new_tokens
    cache = compiled_cache(model, room) if compiled else answer_cache(model, room)
    out = model.generate(  # greedy steps: a sampled run's DrawnToken leaves its draw the only finite score
        **cache,
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=sampling.max_new_tokens,
        do_sample=False,
        logits_processor=LogitsProcessorList(drawn),
        pad_token_id=pad,
        eos_token_id=sorted(stop_ids),
    )
    answers = []
    for row in out[:, width:].tolist():
        cut = next((k for k, t in enumerate(row) if t in stop_ids), None)
        answers.append((row[:cut], cut is not None))
    return answers


def answer_cache(model: Any, room: int) -> dict[str, Any]:
    """`generate`'s cache keyword for a batch of answers: a cache that appends in place (models/growing_cache.py,
    about 1.2x the answers per second of transformers' concatenating one at a batch of 64 on a CPU), or nothing
    for a model whose `generate` builds a cache of its own kind."""
    own = getattr(model, "_supports_default_dynamic_cache", None)  # transformers' test for generate's default
    if own is not None and not own():
        return {}
    return with_cache(model, growing_cache(model.config, room))


def compiled_cache(model: Any, room: int) -> dict[str, Any]:
    """`generate`'s keywords for a compiled batch: transformers' `StaticCache` (fixed shapes, so the decoding
    step compiles once per cache length) and a `CompileConfig`, which `generate` reads to compile the model's
    forward: on a GPU in mode reduce-overhead (CUDA graphs), elsewhere in the default mode, which transformers
    applies off a GPU only when asked (`_compile_all_devices`)."""
    length = -(-room // STATIC_CACHE_STEP) * STATIC_CACHE_STEP
    on_gpu = model.device.type == "cuda"
    config = CompileConfig(mode="reduce-overhead" if on_gpu else "default")
    setattr(config, "_compile_all_devices", not on_gpu)  # noqa: B010 - transformers' switch for off a GPU
    return {
        **with_cache(model, StaticCache(config=model.config, max_cache_len=length)),
        "compile_config": config,
    }


def write_batch(
    writer: RowWriter, convs: list[Conversation], states: dict[int, Answering], counts: dict[str, Any]
) -> None:
    """Append each conversation of a finished batch (or its failure), in input order, and count it."""
    for i, state in states.items():
        if state.failure is not None:
            writer.failure(i, convs[i], state.failure)
            counts["failed"] += 1
            continue
        messages = with_answers(state.prompts[-1], state.answers[:-1])
        messages.append({"role": "assistant", "content": state.answers[-1]})
        writer.row(i, convs[i], messages)
        counts["written"] += 1
        counts["answers"] += len(state.answers)
        counts["completion_tokens"] += state.tokens
        counts["truncated"] += state.truncated
