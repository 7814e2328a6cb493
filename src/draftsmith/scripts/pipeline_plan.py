"""What a pipeline run does and where it writes: the budgets, and the plan of one run (scripts/pipeline.py runs
it; `draftsmith quickstart` is its SmolLM2 preset)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import sha256_file


@dataclass(frozen=True)
class Budget:
    """How much the pipeline regenerates, trains and evaluates."""

    prompts: int  # training prompts answered by the target
    answer_tokens: int  # max new tokens per training answer
    epochs: float  # passes over the cached features
    eval_prompts: int  # held-out prompts per evaluated drafter
    eval_tokens: int  # max new tokens per evaluated answer
    sampled: int = 0  # sampled answers per prompt, besides the greedy one (SAMPLING; seeds 1..sampled)
    recipe: str = "eagle3_smollm2.yaml"  # in recipes/eagle/


# The long budget is the scaled local path: every built-in training prompt, answered greedily and once more by
# sampling (on-policy diversity; 158 against 215 tokens/s at batch 64 with data/nucleus.py's sampler, 87 with
# transformers': docs/BENCHMARKS.md, "The long quickstart"), with
# every position labelled by the target's own greedy token (`draft.labels=top1`, eagle3_smollm2_scale.yaml), which
# a sampled answer's next token is not. The target's answers, not prefilled text: per answer token they were
# worth about 3x as many tokens of the text mix on MT-bench ("Scaling" in docs/BENCHMARKS.md), more than their
# ~2.5x cost (about 400 tokens/s generated in bfloat16 against 1,000 prefilled, then ~1,300 trained). Answers
# stay at 192 tokens: at 320 the batches of 64 run on with the longest answers, and the greedy set alone
# came at about 230 tokens/s (320 of 891 answers in 7 min on 2 cores), too slow for two sets in an hour.
BUDGETS = {
    "short": Budget(prompts=480, answer_tokens=192, epochs=3.0, eval_prompts=16, eval_tokens=128),
    "long": Budget(
        prompts=891,
        answer_tokens=192,
        epochs=3.0,
        eval_prompts=24,
        eval_tokens=160,
        sampled=1,
        recipe="eagle3_smollm2_scale.yaml",
    ),
}
SAMPLING = {"temperature": 0.8, "top_p": 0.95}  # of the sampled answers
# Rows decoded together: a small target's decoding step is mostly fixed per-step cost on a CPU, which a wide
# batch shares.
REGENERATE_BATCH = 64
# Toy targets answer in the style of their training corpus (stdlib functions), so they get its prompts.
TOY_DATA = {"train": "stdlib:train", "heldout": "stdlib:heldout"}
CHAT_DATA = {"train": "prompts:train", "heldout": "prompts:heldout"}


@dataclass(frozen=True)
class Plan:
    """One pipeline run: its target, data, precision, budget, where each stage gets its inputs and writes."""

    target: Path
    data: dict[str, str]  # "train" and "heldout" data sources
    dtype: str  # of the answers, the cache and training
    budget: Budget
    out: Path
    overrides: list[str]  # recipe overrides from the command line
    progress: bool
    serving: str = "auto"  # whose costs choose the serving depth (scripts/pipeline_serving.py)
    answers_from: str = "local"  # local (transformers' generate), vllm (--serve vllm) or a server's URL
    features: str = "cache"  # cache (the target's features stored once) or online (computed at every step)
    compile: str = "auto"  # torch.compile of the answers (`data regenerate --compile`)
    export: tuple[str, ...] = ("vllm",)  # engine layouts written from the trained drafter
    micro_batch: int | None = None  # training's, sized to a GPU (pipeline_memory.py); None: the recipe's

    @property
    def answers(self) -> Path:
        """The target's greedy answers."""
        return self.out / "data" / "answers.jsonl"

    def sampled_answers(self, seed: int) -> Path:
        """The target's answers sampled with `seed` (1..budget.sampled)."""
        return self.out / "data" / f"answers-sampled-{seed}.jsonl"

    @property
    def planned_answer_files(self) -> list[Path]:
        """Every answers file the answers stage writes: the greedy one, then the sampled ones."""
        return [self.answers] + [self.sampled_answers(s) for s in range(1, self.budget.sampled + 1)]

    @property
    def answer_files(self) -> list[Path]:
        """The answers files the drafter trains on: the greedy one, then the sampled ones written (a stage
        stopped at its deadline may have begun none of them)."""
        return [self.answers] + [p for p in self.planned_answer_files[1:] if p.is_file()]

    # A cache and a run per answers content (named by the answer count and the files' sha256): a later run
    # with more --prompts extends the answers files and an answers file edited in place has other bytes, and
    # neither may reuse shards or a checkpoint made from the old ones; the same answers name the same
    # directories, so a killed quickstart resumes in them. Read once stage 2 has written the answers. The run
    # is named by its training settings too (`training_tag`): a recipe changed by a newer draftsmith, other
    # overrides or epochs train a new drafter, where resuming would have handed back the old one.
    @property
    def cache(self) -> Path:
        return self.out / f"cache-{self.budget.prompts}-{self.answers_tag}"

    @property
    def run_dir(self) -> Path:
        return self.out / f"eagle3-{self.budget.prompts}-{self.answers_tag}-{self.training_tag}"

    @property
    def training_tag(self) -> str:
        """The first 6 hex digits of the sha256 of what training reads besides the data: the recipe file's
        bytes, the epochs, the precision and the command line's overrides."""
        recipe = Path(self.recipe).read_bytes()
        settings = [f"epochs={self.budget.epochs!r}", f"dtype={self.dtype}", *self.overrides]
        settings += [] if self.features == "cache" else [f"features={self.features}"]  # cached: as before
        settings += [] if self.micro_batch is None else [f"micro_batch={self.micro_batch}"]
        return hashlib.sha256(recipe + "\n".join(settings).encode()).hexdigest()[:6]

    @property
    def answers_tag(self) -> str:
        """The first 10 hex digits of the answers file's sha256 (of several files: of their sha256s, in order)."""
        missing = [p for p in self.answer_files if not p.is_file()]
        if missing:
            raise UserError(f"{missing[0]} does not exist: the answers stage (2/6) has not written it")
        digests = [sha256_file(p) for p in self.answer_files]
        tag = digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()
        return tag[:10]

    @property
    def recipe(self) -> str:
        return str(files("draftsmith.recipes").joinpath("eagle", self.budget.recipe))

    @property
    def common(self) -> list[str]:
        """The settings the cache and training share: the target, the answers and (features cached) the cache."""
        train = ",".join(str(p) for p in self.answer_files)
        cache = [f"data.cache={self.cache}"] if self.features == "cache" else []
        return [f"target.path={self.target}", f"data.train=[{train}]", *cache]
