"""Temperature / top-k / top-p sampling for `generate`, exact and at the cost of a greedy step.

transformers' samplers work on the whole vocabulary: `TopPLogitsWarper` sorts every row of the batch at every
step and the draw is a multinomial over all of it. At SmolLM2's 49,152 tokens and a batch of 64 on 2 cores,
that is 198 ms (the top-p warper) and 102 ms (softmax and multinomial) a step, where the target's decode step
costs about 170 ms and greedy argmax 3 ms: sampled answers came at 40 % of the greedy rate
(docs/BENCHMARKS.md, "The long quickstart"). This is why the draw is written here rather than left to
`generate(do_sample=True)`.

The same distribution, computed on a few candidates: a row's nucleus (the most probable tokens whose mass,
counted before each, stays under top_p) lies inside its `CANDIDATES` most probable tokens whenever those hold at
least top_p of the mass, and then the nucleus is found from them alone, its probabilities normalized over the
whole vocabulary as the warper does. Rows whose nucleus is wider fall back to the whole vocabulary. Either way
the kept set and its probabilities are those of transformers' temperature, top-k and top-p warpers applied in
that order (eval/sampling.py, whose `Sampling.probs` is the tests' oracle).

`DrawnToken` hands the drawn token to `generate(do_sample=False)` as the only finite score of its row, so the
greedy step takes it and everything else about `generate` (stop tokens, padding, the cache) is unchanged.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

# the most probable tokens searched for a row's nucleus before the row falls back to the whole vocabulary
CANDIDATES = 512


def nucleus(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0, width: int = CANDIDATES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[B, V]` logits -> (probs `[B, C]`, token ids `[B, C]`, covered `[B]`) over each row's C most probable
    tokens (C = top_k where set, else min(width, V)), most probable first: the sampling distribution restricted
    to them, 0 outside the nucleus. `covered[b]` is False where row b's nucleus may reach beyond them; its probs
    are then not the distribution and must be recomputed with `width=V`."""
    vocab = logits.shape[-1]
    scores = logits.float() / temperature
    # top-k bounds the candidates and renormalizes over them; without it the mass is the whole vocabulary's
    limit = min(top_k, vocab) if top_k > 0 else vocab
    count = limit if top_k > 0 else min(width, vocab)
    top, ids = scores.topk(count, dim=-1)  # sorted, most probable first
    norm = torch.logsumexp(top if count == limit else scores, dim=-1, keepdim=True)
    probs = torch.exp(top - norm)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the more probable candidates
    keep = (before < top_p) if top_p < 1 else torch.ones_like(probs, dtype=torch.bool)  # 1: no top-p
    keep[:, 0] = True  # at least one token, as the warpers keep
    if count == limit:
        return probs * keep, ids, torch.ones_like(keep[:, 0])
    return probs * keep, ids, probs.sum(dim=-1) >= top_p


def draw(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    width: int = CANDIDATES,
) -> torch.Tensor:
    """One token id per row of `[B, V]` logits, drawn from the temperature / top-k / top-p distribution."""
    if temperature <= 0:
        raise ValueError(f"sampling needs a temperature > 0 (0 is greedy decoding), got {temperature}")
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    rows = torch.arange(logits.shape[0], device=logits.device)
    while rows.numel():
        probs, ids, covered = nucleus(logits[rows], temperature, top_p, top_k, width)
        picked = torch.multinomial(probs[covered], 1, generator=generator)
        tokens[rows[covered]] = ids[covered].gather(1, picked).squeeze(1)
        rows, width = rows[~covered], logits.shape[-1]  # the rest: the whole vocabulary, always covered
    return tokens


class DrawnToken(LogitsProcessor):
    """A logits processor that samples: each row's scores become -inf but for the drawn token's 0, so that
    `generate(do_sample=False, logits_processor=[DrawnToken(...)])` samples with the global torch RNG."""

    def __init__(self, temperature: float, top_p: float = 1.0, top_k: int = 0) -> None:
        if temperature <= 0:
            raise ValueError(f"DrawnToken samples: temperature must be > 0, got {temperature}")
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = draw(scores, self.temperature, self.top_p, self.top_k)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, tokens[:, None], 0.0)
        return out  # type: ignore[return-value]  # a float tensor; transformers annotates FloatTensor
