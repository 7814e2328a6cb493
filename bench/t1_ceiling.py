"""The highest T>0 chain tau any drafter can reach under the engines' rule for deterministic drafts.

    python -m bench.t1_ceiling --target DIR [--data stdlib:heldout --num-prompts 20 --max-new-tokens 96 --depth 5]

EAGLE, Medusa, MTP, DFlash and P-EAGLE draft their top-ranked tokens, also at T > 0, and vLLM and SGLang
verify such drafts with the point-mass rule (eval/verify.py): a draft c is accepted with probability p(c),
and on rejection the token is drawn from p with c removed. So a draft is accepted exactly when the committed
token equals it, and the committed tokens are a plain T > 0 sample of the target whatever the drafter does.

The best deterministic drafter therefore proposes the target's own argmax at every depth, and its tau can be
read off plain samples without running any drafter: sample each answer with the target, mark the positions
whose token is the argmax there, and walk the answer as verification would (a step accepts the run of
matching tokens that starts at it, at most `depth`, and commits one more). tau = tokens / steps over all
answers, the evaluator's definition. No trained drafter can beat this number at the same temperature; the
difference between two drafters is a share of the gap between 1 and it.

Feeds docs/BENCHMARKS.md, "DFlash, P-EAGLE and the acceptance losses on the `small` toy target".
"""

from __future__ import annotations

import argparse
import json
import math

import torch


def oracle_steps(is_argmax: list[bool], depth: int) -> int:
    """Verification steps a perfect argmax drafter needs for one answer (`is_argmax[i]`: token i is the
    target's argmax at its position)."""
    pos = steps = 0
    n = len(is_argmax)
    while pos < n:
        run = 0
        while run < depth and pos + run < n - 1 and is_argmax[pos + run]:
            run += 1
        pos += run + 1  # the accepted run, then the target's own token (correction or bonus)
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="the target directory")
    parser.add_argument("--data", default="stdlib:heldout", help="held-out prompts (the evaluator's formats)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations
    from draftsmith.eval.decoder import plain_decode
    from draftsmith.eval.sampling import Sampling
    from draftsmith.models.target import FrozenTarget, TargetConfig

    target = FrozenTarget.load(TargetConfig(path=args.target), torch.device("cpu"))
    sampling = Sampling(args.temperature)
    convs = [c for c in read_conversations(args.data, "auto") if prompt_turns(c)][: args.num_prompts]
    tokens = steps = 0
    taus, max_p = [], []
    for index, conv in enumerate(convs):
        prompt = render_prompt(target.tokenizer, prompt_turns(conv)[0], conv.tools)
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + index * 101)
        answer = plain_decode(target, prompt, args.max_new_tokens, sampling, generator).tokens
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([prompt + answer])).logits[0].float()
        # logits[i] predicts token i + 1: the answer's tokens are predicted by rows len(prompt)-1 .. end-1.
        rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(answer)]
        is_argmax = (rows.argmax(-1) == torch.tensor(answer)).tolist()
        max_p += sampling.probs(rows).max(-1).values.tolist()
        s = oracle_steps(is_argmax, args.depth)
        tokens, steps = tokens + len(answer), steps + s
        taus.append(len(answer) / s)
    mean = sum(taus) / len(taus)
    stderr = (
        math.sqrt(sum((t - mean) ** 2 for t in taus) / (len(taus) - 1) / len(taus)) if len(taus) > 1 else 0.0
    )
    print(
        json.dumps(
            {
                "temperature": args.temperature,
                "depth": args.depth,
                "prompts": len(taus),
                "tokens": tokens,
                "oracle_tau": tokens / steps,
                "tau_stderr": stderr,
                "mean_max_p": sum(max_p) / len(max_p),
            }
        )
    )


if __name__ == "__main__":
    main()
