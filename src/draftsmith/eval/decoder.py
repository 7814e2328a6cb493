"""The one speculative decoding loop, for every drafter (DESIGN.md section 3, ALGORITHMS.md section 9).

Per sequence: a prefill forward over the prompt gives the first new token (drawn exactly as plain decoding
would). Then each step the drafter proposes a tree rooted at the last committed token; ONE target forward
over the tree's tokens (tree attention: a 4D mask and depth-based position ids; a chain uses the ordinary
causal path) gives the target's logits at every node; `verify` picks the accepted path and the extra token;
the cache keeps the prefix plus that path. Every step commits accepted + 1 tokens.

Bookkeeping follows ALGORITHMS.md 9.6: tau counts the tokens committed by verification steps (the bonus or
correction token included) per verification forward; the prefill forward and its token are excluded.
Drafts never reach past `max_new_tokens` (the depth shrinks near the end, as transformers does; with
`drafts_at_budget="full"` they keep their depth and a step's acceptances past the budget are counted, as vLLM's
scheduler does, while the answer still stops at the budget), and a stop token ends the sequence even in the
middle of an accepted path.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from draftsmith.models.parts import with_cache
from draftsmith.models.target import FrozenTarget, stop_token_ids

from .drafters.base import Drafter, check_depth
from .kv_cache import Snapshot, has_linear_attention, keep_path, new_cache, restore, snapshot
from .sampling import Sampling, sample
from .tree import DraftTree, TreeShape, layer_tree_masks
from .verify import verify


@dataclass
class Step:
    """One verification step: draft tokens sent, tree depth, draft tokens accepted, tokens committed (after
    any stop/length cut), and the time spent drafting and verifying (forward + verify + cache)."""

    draft_tokens: int
    depth: int
    accepted: int
    committed: int
    cache_len: int
    draft_s: float
    verify_s: float


@dataclass
class Generation:
    tokens: list[int]  # new tokens, the stop token included when one was produced
    steps: list[Step] = field(default_factory=list)
    stop: str = "length"  # "eos" or "length"
    wall_s: float = 0.0

    @property
    def step_tokens(self) -> int:
        """Tokens committed by verification steps (all new tokens but the prefill's)."""
        return sum(s.committed for s in self.steps)


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The token plain decoding takes from next-token logits `[V]`."""
    if sampling.greedy:
        return int(logits.argmax())
    return sample(sampling.probs(logits), generator)


def _timer(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class SpeculativeDecoder:
    """Speculative decoding of one sequence at a time (batch size 1, as the papers measure).

    Args:
        target: the frozen target.
        drafter: any object following `drafters.base.Drafter`.
        shape: the draft-tree shape (depth included).
        sampling: temperature / top-p / top-k; temperature 0 is greedy.
        acceptance: "exact" (lossless) or "typical" (Medusa's lossy rule).
        kv_cache: the target's key/value cache: "auto" (the model's dtype) or "fp8" (float8 e4m3, per-tensor
            scale, as vLLM's `--kv-cache-dtype fp8`); `eval/kv_cache.py`.
    """

    def __init__(
        self,
        target: FrozenTarget,
        drafter: Drafter,
        shape: TreeShape,
        sampling: Sampling,
        acceptance: str = "exact",
        kv_cache: str = "auto",
        drafts_at_budget: str = "shrink",
    ):
        check_depth(drafter, shape)
        if drafts_at_budget not in ("shrink", "full"):
            raise ValueError(f"drafts_at_budget must be 'shrink' or 'full', got {drafts_at_budget!r}")
        self.shrink_at_budget = drafts_at_budget == "shrink"
        config = target.model.config
        new_cache(config, kv_cache)  # refuses a cache this target cannot use, before any decoding
        self.kv_cache = kv_cache
        self.text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        # Linear-attention layers (Qwen3-Next, Qwen3.5) read their input in sequence order, so they cannot
        # verify a tree in one forward, and their state cannot be cut back after a rejection: it is copied
        # before each verification and, when a draft token was rejected, restored and the accepted tokens fed
        # again (one more target forward on such steps: wall time and tokens/s include it, tau counts
        # verification forwards only).
        self.recurrent = has_linear_attention(config)
        if self.recurrent and not (shape.is_chain or shape.depth == 0):
            raise ValueError(
                f"target {target.name_or_path!r} has linear-attention layers, which read tokens in order and cannot "
                f"verify a draft tree ({shape.name}) in one pass; use --tree chain"
            )
        self.target = target
        self.drafter = drafter
        self.shape = shape
        self.sampling = sampling
        self.acceptance = acceptance
        self.stop_ids = stop_token_ids(target)
        self.layer_ids = tuple(drafter.feature_layers)

    def _forward(self, ids: torch.Tensor, cache: Any, mask: Any = None, positions: Any = None) -> Any:
        return self.target.forward(
            ids[None].to(self.target.device),
            attention_mask=mask,
            layer_ids=self.layer_ids,
            return_logits=True,
            position_ids=positions,
            past_key_values=cache,
        )

    @torch.no_grad()
    def generate(
        self, prompt: list[int], max_new_tokens: int, generator: torch.Generator | None = None
    ) -> Generation:
        """Decode up to `max_new_tokens` new tokens after `prompt` (stopping at an end-of-sequence token)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        t_start = _timer(self.target.device)
        cache, first = self._prefill(prompt, generator)
        out = Generation([first])
        context = list(prompt) + [first]
        if first in self.stop_ids:
            out.stop = "eos"
        while out.stop != "eos" and len(out.tokens) < max_new_tokens:
            out.steps.append(self._step(out, context, cache, max_new_tokens, generator))
        out.wall_s = _timer(self.target.device) - t_start
        return out

    def _prefill(self, prompt: list[int], generator: torch.Generator | None) -> tuple[Any, int]:
        """A new cache holding `prompt`, the drafter started on its features, and the first new token (drawn
        exactly as plain decoding draws it)."""
        cache = new_cache(self.target.model.config, self.kv_cache)
        self.drafter.start()
        features, logits = self._forward(torch.tensor(prompt), cache)
        self.drafter.observe({k: v[0] for k, v in features.items()})
        return cache, pick(logits[0, -1], self.sampling, generator)

    def _step(
        self,
        out: Generation,
        context: list[int],
        cache: Any,
        max_new_tokens: int,
        generator: torch.Generator | None,
    ) -> Step:
        """One verification step: draft, verify the draft in one target forward, keep the accepted path in the
        cache and commit its tokens to `out` and `context`."""
        device = self.target.device
        shape = self._step_shape(max_new_tokens - len(out.tokens) - 1)  # the step's own token always fits
        t0 = _timer(device)
        tree = self.drafter.propose(context, shape, self.sampling, generator)
        t1 = _timer(device)
        past = len(context) - 1
        before = snapshot(cache) if self.recurrent else None
        features, logits = self._verify_forward(tree, cache, past)
        verdict = verify(tree, logits[0], self.sampling, generator, self.acceptance)
        self._keep_path(cache, before, tree, verdict.path, past)
        new = tree.tokens[verdict.path[1:]].tolist() + [verdict.token]
        self.drafter.observe({k: v[0, verdict.path] for k, v in features.items()})
        committed = _commit(out, context, new, max_new_tokens, self.stop_ids)
        t2 = _timer(device)
        depth_max = max(tree.depths())
        return Step(tree.num_draft, depth_max, verdict.accepted, committed, past, t1 - t0, t2 - t1)

    def _step_shape(self, room: int) -> TreeShape:
        """The step's tree shape: cut to the `room` left in the budget when drafts shrink there."""
        if self.shrink_at_budget and self.shape.depth > room:
            return self.shape.truncated(room)
        return self.shape

    def _verify_forward(self, tree: DraftTree, cache: Any, past: int) -> Any:
        """`(features, logits)` of the target at every node of `tree`, in one forward after `past` cached
        positions."""
        if tree.parents == list(range(-1, len(tree) - 1)):  # a chain: the ordinary causal forward
            return self._forward(tree.tokens, cache)
        device = self.target.device
        positions = [past + d for d in tree.depths()]
        mask = layer_tree_masks(
            tree.ancestor_mask(),
            positions,
            positions,
            past,
            self.text_config,
            self.target.model.dtype,
            device,
        )
        return self._forward(tree.tokens, cache, mask, torch.tensor([positions], device=device))

    @torch.no_grad()
    def verify_costs(self, prompt: list[int], max_tokens: int, repeats: int = 5) -> list[float]:
        """The cost profile of eval/depth.py: median seconds of the verification forward over n = 1..max_tokens
        tokens (index n - 1), after `prompt` in the cache, run as `_step` runs a chain's (features and logits
        of every position) and cut back after each. The sizes take turns, `repeats` rounds after one round
        not measured, so a slow start or a drifting clock does not bill one size alone."""
        if max_tokens < 1 or repeats < 1:
            raise ValueError(f"max_tokens and repeats must be >= 1, got {max_tokens} and {repeats}")
        cache = new_cache(self.target.model.config, self.kv_cache)
        self._forward(torch.tensor(prompt), cache)
        before = snapshot(cache)
        ids = torch.tensor(list(itertools.islice(itertools.cycle(reversed(prompt)), max_tokens)))
        times: list[list[float]] = [[] for _ in range(max_tokens)]
        for round_ in range(repeats + 1):
            for n in range(1, max_tokens + 1):
                t0 = _timer(self.target.device)
                self._forward(ids[:n], cache)
                elapsed = _timer(self.target.device) - t0
                restore(cache, before)
                if round_:
                    times[n - 1].append(elapsed)
        return [statistics.median(t) for t in times]

    def _keep_path(
        self, cache: Any, before: Snapshot | None, tree: DraftTree, path: list[int], past: int
    ) -> None:
        """Cut the cache back to the `past` positions and the accepted `path` of `tree`."""
        if before is not None and len(path) < len(tree):
            restore(cache, before)  # linear-attention state: back to before the chain, then the kept part
            self._forward(tree.tokens[path], cache)
        else:
            keep_path(cache, past, path)


def _commit(
    out: Generation, context: list[int], new: list[int], max_new_tokens: int, stop_ids: set[int]
) -> int:
    """Append a step's `new` tokens to the answer and the context, up to the budget or a stop token (which
    ends the answer); returns how many were appended."""
    committed = 0
    for tok in new:
        if len(out.tokens) == max_new_tokens:
            break
        out.tokens.append(tok)
        context.append(tok)
        committed += 1
        if tok in stop_ids:
            out.stop = "eos"
            break
    return committed


@torch.no_grad()
def plain_decode(
    target: FrozenTarget,
    prompt: list[int],
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    stop_ids: set[int] | None = None,
    kv_cache: str = "auto",
) -> Generation:
    """Vanilla autoregressive decoding with a KV cache: the baseline for speedup and the T=0 oracle.

    One target forward per token, LM head on the last position only, no drafter and no hooks: as cheap as
    plain decoding gets in eager transformers, so the reported speedup is not flattered by a slow baseline.
    `kv_cache="fp8"` stores keys and values as speculative decoding with the same setting does.
    """
    stop_ids = stop_token_ids(target) if stop_ids is None else stop_ids
    device = target.device
    t_start = _timer(device)
    config = target.model.config
    # The model's own default cache (never rolled back), or the same fp8 layers speculative decoding uses.
    cache = DynamicCache(config=config) if kv_cache == "auto" else new_cache(config, kv_cache)
    ids = torch.tensor([prompt], device=device)
    out = Generation([])
    while True:
        logits = target.model(
            input_ids=ids, **with_cache(target.model, cache), use_cache=True, logits_to_keep=1
        ).logits
        tok = pick(logits[0, -1], sampling, generator)
        out.tokens.append(tok)
        if tok in stop_ids:
            out.stop = "eos"
            break
        if len(out.tokens) == max_new_tokens:
            break
        ids = torch.tensor([[tok]], device=device)
    out.wall_s = _timer(device) - t_start
    return out
