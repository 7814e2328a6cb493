"""The drafter families: one record per kind, the one place that says what a kind is made of.

Every layer looks a kind up here: the checkpoint loader (its module and config), `draftsmith train` (its
training method), the evaluator (its adapter in eval/drafters/), export and push (its layouts per engine, the
engines that serve it and for which targets), the model card (its title, tags, feature layers and vocabulary
map), and every help text that lists kinds. Parts that live above `models/` (the evaluator adapter, the layouts) are named
by dotted path and imported only when asked for, so `models/` imports nothing of train/, eval/ or ship/.

Adding a family is one record here plus the files it names (docs/ADDING-A-FAMILY.md);
tests/unit/models/test_families.py checks that every record's parts exist, every engine is either served
or refused with a reason, and no other module branches on a kind or lists kinds by hand.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("vllm", "sglang", "tgi", "hf")


@dataclass(frozen=True)
class Family:
    """What one drafter kind is made of. Dotted paths are `module:attribute`; None says the part does not exist
    for this kind, and `why_not` says why."""

    kind: str
    title: str  # the model card's name for it ("EAGLE-3 draft head")
    tags: tuple[str, ...]  # Hub tags beside "speculative-decoding" and "draftsmith"
    module: str | None  # the trained nn.Module class (None: no weights, e.g. ngram)
    config: (
        str | None
    )  # its hyper-parameter dataclass (the recipe's `draft:` section; the checkpoint loader's)
    train_method: str | None  # `draftsmith train METHOD` (train/<METHOD>.py) that produces it
    drafter: str  # the evaluator's adapter: eval/drafters/
    layouts: dict[str, str] = field(default_factory=dict)  # engine -> export layout function (ship/layouts/)
    why_not: dict[str, str] = field(default_factory=dict)  # part or engine -> why this kind has none
    feature_layers: bool = False  # whether it reads target features (the card lists them)
    # `(target, checkpoint dir) -> FrozenTarget | None`: the target an engine serves beside a checkpoint of this
    # kind when the checkpoint changes it (Medusa-2's adapter, merged); the evaluator decodes with it.
    served_target: str | None = None
    # The target model types (a collection, by dotted path) engines serve it beside; None: any target.
    served_targets: str | None = None
    # `draft.layer` -> the engines that serve it with that draft layer, when fewer than `layouts` say.
    layer_engines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    serving_note: str = ""  # the limits above in words, for help texts and error messages
    vocab_map: bool = False  # drafts over a reduced vocabulary mapped by d2t / t2d (the card gives its size)
    # its checkpoint is itself the directory every engine loads (push uploads it at the repository root).
    ships_as_is: bool = False
    # A few-step run on a tiny target: its recipe under recipes/ and the overrides that make it small. The
    # architecture matrix (bench/arch_matrix.py, tests/unit/test_architectures.py) trains, decodes and exports
    # every kind that has one on every architecture, so a new family is in the matrix by its record alone.
    tiny_recipe: str | None = None
    tiny_overrides: tuple[str, ...] = ()

    def resolve(self, part: str) -> Any:
        """The object a dotted-path part names (`module`, `config`, `drafter`, `served_target`, `served_targets`, or
        `layout:ENGINE`).

        Raises:
            ValueError: the part does not exist for this kind (with the reason).
        """
        path = self.layouts.get(part.split(":", 1)[1]) if part.startswith("layout:") else getattr(self, part)
        if path is None:
            reason = self.why_not.get(part.split(":", 1)[-1], "not provided")
            raise ValueError(f"drafter kind {self.kind!r} has no {part}: {reason}")
        module, _, attr = path.partition(":")
        obj: Any = importlib.import_module(module)
        for name in attr.split("."):
            obj = getattr(obj, name)
        return obj

    def serves(self, engine: str) -> bool:
        return engine in self.layouts


_M, _E, _S = "draftsmith.models", "draftsmith.eval.drafters", "draftsmith.ship.layouts"


def index(families: tuple[Family, ...]) -> dict[str, Family]:
    """Kind -> record; a kind registered twice raises ValueError."""
    out: dict[str, Family] = {}
    for f in families:
        if f.kind in out:
            raise ValueError(f"drafter kind {f.kind!r} is registered twice in models/families.py")
        out[f.kind] = f
    return out


FAMILIES: dict[str, Family] = index(
    (
        Family(
            kind="medusa",
            title="Medusa heads",
            tags=("medusa",),
            module=f"{_M}.medusa:MedusaHeads",
            config=f"{_M}.medusa:MedusaConfig",
            train_method="medusa",
            drafter=f"{_E}.medusa:MedusaDrafter",
            layouts={
                "vllm": f"{_S}.medusa:medusa_vllm",
                "tgi": f"{_S}.medusa:medusa_tgi",
                "hf": f"{_S}.medusa:medusa_tgi",
            },
            why_not={"sglang": "SGLang has no Medusa"},
            served_target=f"{_M}.medusa2:merged_adapter",
            tiny_recipe="medusa/tiny.yaml",
            tiny_overrides=("draft.num_heads=2",),
        ),
        Family(
            kind="eagle",
            title="EAGLE-1 draft head",
            tags=("eagle",),
            module=f"{_M}.eagle:Eagle1Draft",
            config=f"{_M}.eagle:EagleConfig",
            train_method="eagle",
            drafter=f"{_E}.eagle:EagleDrafter",
            layouts={
                "vllm": f"{_S}.eagle:eagle1",
                "sglang": f"{_S}.eagle:eagle1",
                "hf": f"{_S}.eagle:eagle1",
            },
            why_not={"tgi": "TGI has no EAGLE"},
            feature_layers=True,
            tiny_recipe="eagle/eagle1_toy.yaml",
        ),
        Family(
            kind="eagle3",
            title="EAGLE-3 draft head",
            tags=("eagle3", "eagle"),
            module=f"{_M}.eagle3:Eagle3Draft",
            config=f"{_M}.eagle:EagleConfig",
            train_method="eagle",
            drafter=f"{_E}.eagle:EagleDrafter",
            layouts={
                "vllm": f"{_S}.eagle:eagle3_speculators",
                "sglang": f"{_S}.eagle:eagle3_sglang",
                "hf": f"{_S}.eagle:eagle3_sglang",
            },
            why_not={"tgi": "TGI has no EAGLE"},
            feature_layers=True,
            vocab_map=True,
            serving_note="any target; with the qwen3 draft layer: vLLM only",
            layer_engines={"qwen3": ("vllm",)},
            tiny_recipe="eagle/eagle3_tiny.yaml",
            tiny_overrides=("draft.feature_layers=[1,2,3]", "draft.ttt_steps=2"),
        ),
        Family(
            kind="mtp",
            title="MTP modules",
            tags=("mtp",),
            module=f"{_M}.mtp:MTPDraft",
            config=f"{_M}.mtp:MTPConfig",
            train_method="mtp",
            drafter=f"{_E}.mtp:MTPDrafter",
            layouts={
                "vllm": f"{_S}.mtp:mtp_native",
                "sglang": f"{_S}.mtp:mtp_native",
                "hf": f"{_S}.mtp:mtp_native",
            },
            why_not={"tgi": "TGI has no MTP"},
            feature_layers=True,
            served_targets=f"{_M}.mtp:NATIVE_MTP",
            serving_note="only for DeepSeek-V3 (nextn) and Qwen3-Next / Qwen3.5 (mtp.*) targets",
            tiny_recipe="mtp/toy.yaml",
            tiny_overrides=("draft.num_modules=1", "train.allow_unserved=false"),
        ),
        Family(
            kind="draft_lm",
            title="distilled draft model",
            tags=("draft-model", "distillation"),
            module=f"{_M}.draft_lm:build_draft_lm",
            config=f"{_M}.draft_lm:DraftLMConfig",
            train_method="distill",
            drafter=f"{_E}.draft_lm:LMDrafter",
            layouts={
                "vllm": f"{_S}.draft_lm:draft_lm_hf",
                "sglang": f"{_S}.draft_lm:draft_lm_hf",
                "hf": f"{_S}.draft_lm:draft_lm_hf",
            },
            why_not={"tgi": "TGI has no separate draft model"},
            serving_note="beside a target it shares a tokenizer with",
            ships_as_is=True,
            tiny_recipe="distill/toy.yaml",
        ),
        Family(
            kind="dflash",
            title="DFlash block drafter",
            tags=("dflash", "block-diffusion"),
            module=f"{_M}.dflash:DFlashDraft",
            config=f"{_M}.dflash:DFlashConfig",
            train_method="dflash",
            drafter=f"{_E}.dflash:DFlashDrafter",
            layouts={
                "vllm": f"{_S}.dflash:dflash_speculators",
                "sglang": f"{_S}.dflash:dflash_sglang",
                "hf": f"{_S}.dflash:dflash_sglang",
            },
            why_not={"tgi": "TGI has no DFlash"},
            feature_layers=True,
            tiny_recipe="dflash/tiny.yaml",
            tiny_overrides=("draft.feature_layers=[1,2,3]", "draft.num_anchors=8"),
        ),
        Family(
            kind="peagle",
            title="P-EAGLE parallel draft head",
            tags=("peagle", "eagle3", "eagle"),
            module=f"{_M}.peagle:PEagleDraft",
            config=f"{_M}.peagle:PEagleConfig",
            train_method="peagle",
            drafter=f"{_E}.peagle:PEagleDrafter",
            layouts={"vllm": f"{_S}.peagle:peagle_speculators", "hf": f"{_S}.peagle:peagle_speculators"},
            why_not={
                "sglang": "SGLang has no parallel-drafting EAGLE (P-EAGLE is served by vLLM's eagle3 method "
                "with parallel_drafting)",
                "tgi": "TGI has no EAGLE",
            },
            feature_layers=True,
            vocab_map=True,
            tiny_recipe="peagle/tiny.yaml",
            tiny_overrides=("draft.feature_layers=[1,2,3]",),
        ),
        Family(
            kind="ngram",
            title="n-gram prompt lookup",
            tags=("ngram",),
            module=None,
            config=None,
            train_method=None,
            drafter=f"{_E}.ngram:NgramDrafter",
            why_not={
                "module": "prompt lookup has no weights",
                "config": "set by the evaluator's --ngram-* options",
                "train_method": "nothing is trained",
                **{
                    e: "engines run prompt lookup themselves (vLLM / SGLang `ngram`, TGI `--speculate`)"
                    for e in ENGINES
                },
            },
        ),
    )
)


def family(kind: str) -> Family:
    """The record of `kind`; an unknown kind lists the known ones."""
    if kind not in FAMILIES:
        raise ValueError(f"unknown drafter kind {kind!r}; known kinds: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[kind]


def drafter_class(kind: str) -> type:
    """The trained module class of `kind` (what a checkpoint's config.json `kind` names)."""
    cls: type = family(kind).resolve("module")
    return cls


def train_methods() -> dict[str, list[str]]:
    """`draftsmith train` methods -> the kinds each produces (`eagle` trains EAGLE-1 and EAGLE-3)."""
    methods: dict[str, list[str]] = {}
    for f in FAMILIES.values():
        if f.train_method is not None:
            methods.setdefault(f.train_method, []).append(f.kind)
    return methods
