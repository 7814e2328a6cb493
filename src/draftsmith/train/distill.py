"""Distil a small draft LM to the frozen target (ALGORITHMS.md section 8: DistillSpec, GKD).

    accelerate launch train/distill.py --config recipes/distill/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train distill --config recipes/distill/toy.yaml target.path=DIR output_dir=OUT [--resume]

`distill.divergence` picks the objective on every answer position t (the draft's q and the target's p for
token t+1, both at `distill.temperature`): fkl = KL(p||q), rkl = KL(q||p), jsd = JSD(beta), tvd (whose
minimum is maximal acceptance), or ce = plain cross-entropy on the data's tokens (no target, the baseline).
The data generator: the recipe's data as is (fixed), the target's own answers (point `data.train` at the
output of `draftsmith data regenerate`: sequence-level KD), and with `distill.on_policy: lambda` a batch is
replaced, with probability lambda, by the draft's own samples from its prompts, scored by the target
online (GKD). Logged: `accept` = the expected acceptance sum_v min(p, q) per answer token (at the
training temperature), `top1` = greedy agreement, and `tau_estimate` = the depth-5 chain tau those imply
if acceptance were independent across depths (an ESTIMATE: the evaluator measures the real one).

`final/` is a plain transformers model directory (plus the target's tokenizer and draftsmith.json), which
`draftsmith eval --drafter OUT/final` and engines' draft-model methods load as is.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from draftsmith.models.chunking import LOSS_CHUNK_TOKENS, ChunkResult, chunk_positions, chunked_loss
from draftsmith.models.divergences import distill_loss
from draftsmith.models.draft_lm import DraftLMConfig, build_draft_lm, draft_layer_indices, save_draft_lm
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget, LayerId, stop_token_ids
from draftsmith.models.target_parts import TargetHead
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import run_main
from draftsmith.runtime.tokens import left_pad
from draftsmith.train.core.data import DataBundle, collate
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import start_to_end
from draftsmith.train.core.recipe import Recipe, RecipeConfig, RecipeHead, run_dir, seed_field

TAU_ESTIMATE_DEPTH = 5


@dataclass
class DistillConfig:
    """The objective and the data generator (the `distill:` section)."""

    divergence: Literal["fkl", "rkl", "jsd", "tvd", "ce"] = field(
        default="fkl",
        metadata={"help": "fkl | rkl | jsd | tvd against the target's distribution, or ce on data tokens."},
    )
    beta: float = field(
        default=0.5, metadata={"help": "jsd: weight of the target p in m = beta p + (1-beta) q."}
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Applied to target and draft alike: distil at the temperature you will decode at."},
    )
    on_policy: float = field(
        default=0.0,
        metadata={"help": "GKD lambda: probability that a training batch is the draft's own samples."},
    )
    sample_temperature: float = field(
        default=1.0, metadata={"help": "on_policy: temperature of the draft's samples."}
    )
    max_new_tokens: int = field(default=128, metadata={"help": "on_policy: tokens sampled per prompt."})
    vocab_chunk: int = field(default=8192, metadata={"help": "Vocabulary slice of the divergence (memory)."})

    def __post_init__(self) -> None:
        if not 0.0 <= self.on_policy <= 1.0:
            raise ValueError(f"distill.on_policy is a probability, got {self.on_policy}")
        if self.divergence == "jsd" and not 0.0 < self.beta < 1.0:
            raise ValueError(f"distill.beta must be in (0, 1) for jsd (0 / 1 are fkl / rkl), got {self.beta}")
        if self.temperature <= 0 or self.sample_temperature <= 0:
            raise ValueError("distill.temperature and distill.sample_temperature must be > 0")
        if self.on_policy and self.divergence == "ce":
            raise ValueError(
                "distill.divergence=ce trains on data tokens; on-policy samples need a divergence"
            )


@dataclass
class DistillSection(RecipeHead[DraftLMConfig]):
    """The `distill` section, between `draft` and `train` (see train/core/recipe.py)."""

    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass
class DistillRecipe(RecipeConfig[DraftLMConfig], DistillSection):
    """Everything a distillation run needs; YAML recipes under recipes/distill/ mirror it."""

    output_dir: str = run_dir("runs/distill")
    seed: int = seed_field("Seed for initialisation, data split, order, sampling.")
    draft: DraftLMConfig = field(default_factory=DraftLMConfig)


RECIPE = DistillRecipe


def answer_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Positions t whose next token t+1 is an answer token: where the draft's prediction is trained."""
    return shift_left(batch["loss_mask"]).bool()


def draft_head(draft: Any, length: int = 8) -> TargetHead:
    """The draft LM's logits from its last (post-norm) hidden state, exactly as its own forward computes them
    (the LM head plus any logit scaling or soft-capping its config sets), checked on a few tokens.

    Raises:
        ValueError: a draft whose logits this does not reproduce (its loss would be computed wrongly).
    """
    config = draft.config.get_text_config() if hasattr(draft.config, "get_text_config") else draft.config
    head = TargetHead(draft.get_output_embeddings(), config)
    was_training = draft.training
    draft.eval()
    with torch.no_grad():
        ids = torch.arange(length, device=next(draft.parameters()).device)[None] % int(config.vocab_size)
        out = draft(input_ids=ids, output_hidden_states=True)
        err = (head(out.hidden_states[-1]) - out.logits).abs().max().item()
    draft.train(was_training)
    if not err <= 1e-4 * max(1.0, out.logits.abs().max().item()):
        raise ValueError(
            f"the draft model ({type(draft).__name__}) computes its logits from its last hidden state in a way "
            f"draftsmith does not reproduce (max difference {err:.3g}); distillation computes them chunk by chunk "
            "from that state, so it cannot train this draft. Please report the architecture."
        )
    return head


class DistillMethod(TrainingMethod):
    """The loop's view of distillation: one loss term over answer positions.

    `loss_chunk`: tokens whose logits (the draft's and the target's) are computed at once (see
    `chunked_loss`); the loss is the same for any value.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft: nn.Module,
        cfg: DistillConfig,
        seed: int,
        pad_id: int,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
    ):
        self.target = target
        self.model = draft
        self.head = draft_head(draft)
        self.loss_chunk = loss_chunk
        self.cfg = cfg
        self.seed = seed
        self.pad_id = pad_id
        self.term_names = [cfg.divergence]
        self.term_weights = torch.ones(1)
        self.stop_ids = stop_token_ids(target)
        # On-policy steps generate with the draft on some ranks only, which a sharded (FSDP / ZeRO-3) draft
        # cannot do: every forward there is a collective. train_main refuses that combination.
        self.generates = cfg.on_policy > 0

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return answer_positions(batch).sum().float().reshape(1)

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        # The draft's last hidden state, without its [B, T, V] logits (the head runs per chunk in the loss).
        out = model(
            input_ids=ids,
            attention_mask=batch["attention_mask"],
            output_hidden_states=True,
            logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids.device),
        )
        feats, _ = self.target.batch_features(batch, ("final",))
        inputs = (out.hidden_states[-1], feats["final"], answer_positions(batch), shift_left(ids))
        sums, _, metrics = chunked_loss(
            self._chunk_loss, inputs, chunk_positions(ids.shape[0], self.loss_chunk)
        )
        return sums, metrics

    def _chunk_loss(
        self, hidden: torch.Tensor, final: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
    ) -> ChunkResult:
        """One chunk: the draft's `hidden [B, c, H]`, the target's `final [B, c, H]`, the trained positions
        `mask [B, c]` and the data's next tokens `labels [B, c]` -> `distill_loss` over the trained positions."""
        with torch.no_grad():
            target_logits = self.target.head(final[mask])  # [n, V]
        cfg = self.cfg
        return distill_loss(
            target_logits,
            self.head(hidden[mask]),
            labels[mask],
            cfg.divergence,
            beta=cfg.beta,
            temperature=cfg.temperature,
            vocab_chunk=cfg.vocab_chunk,
        )

    def prepare_batch(
        self, model: nn.Module, batch: dict[str, torch.Tensor], step: int, index: int, rank: int
    ) -> dict[str, torch.Tensor]:
        """GKD: with probability `on_policy`, replace the batch's answers by the draft's own samples."""
        if self.cfg.on_policy <= 0:
            return batch
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + step * 1_009 + index * 17 + rank)
            if float(torch.rand(())) >= self.cfg.on_policy:
                return batch
            return self._on_policy(model.module if hasattr(model, "module") else model, batch)

    @torch.no_grad()
    def _on_policy(self, draft: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids, loss_mask = batch["input_ids"], batch["loss_mask"].bool()
        max_len = ids.shape[1]
        prompts = []
        for row, mask, attn in zip(ids, loss_mask, batch["attention_mask"].bool(), strict=True):
            first = int(mask.float().argmax()) if mask.any() else int(attn.sum())  # the first answer token
            prompts.append(row[:first].tolist())
        keep = [len(p) > 0 and len(p) < max_len for p in prompts]
        if not any(keep):
            return batch
        padded, attn = left_pad([p for p, k in zip(prompts, keep, strict=True) if k], self.pad_id, ids.device)
        width = padded.shape[1]
        was_training = draft.training
        draft.eval()
        out = draft.generate(
            input_ids=padded,
            attention_mask=attn,
            do_sample=True,
            temperature=self.cfg.sample_temperature,
            top_p=None,
            top_k=None,
            max_new_tokens=max(1, min(self.cfg.max_new_tokens, max_len - width)),
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.stop_ids),
        )[:, width:].tolist()
        draft.train(was_training)
        samples, drafts = [], iter(out)
        for i, (p, k) in enumerate(zip(prompts, keep, strict=True)):
            if not k:  # no prompt before its first answer token (e.g. a text document): kept as it was
                n = int(batch["attention_mask"][i].sum())
                samples.append({"input_ids": ids[i, :n].cpu(), "loss_mask": loss_mask[i, :n].cpu()})
                continue
            new = next(drafts)
            cut = next((j + 1 for j, t in enumerate(new) if t in self.stop_ids), len(new))  # keep the stop
            new = new[: min(cut, max_len - len(p))]
            samples.append(
                {"input_ids": torch.tensor(p + new), "loss_mask": torch.tensor([0] * len(p) + [1] * len(new))}
            )
        return {k: v.to(ids.device) for k, v in collate(samples, self.pad_id).items()}

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate` = sum_{d=0..5} alpha^d with alpha the mean expected acceptance (i.i.d. estimate)."""
        alpha = record.get(f"{prefix}/{self.term_names[0]}/accept")
        if alpha is None:
            return {}
        return {f"{prefix}/tau_estimate": sum(alpha**d for d in range(TAU_ESTIMATE_DEPTH + 1))}

    def report(self, result: LoopResult) -> str:
        return format_report(result.eval, self.term_names[0], result.initial_eval)

    def save_final(
        self, out: Path, target: FrozenTarget, extra: dict[str, Any], state_dict: dict[str, Any] | None
    ) -> Path:
        """A transformers directory with the target's tokenizer (what engines load as a draft model)."""
        return save_draft_lm(out, self.model, target, extra, state_dict=state_dict)


def cache_layers(cfg: DistillRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold: `final`, through which the frozen head gives the target's logits."""
    if cfg.distill.on_policy > 0:
        raise ValueError(
            f"distill.on_policy={cfg.distill.on_policy} scores the draft's own samples with the live target, "
            "which an offline cache cannot do: set distill.on_policy=0 or drop data.cache"
        )
    return ["final"]


def build_method(cfg: DistillRecipe, target: FrozenTarget, data: DataBundle) -> DistillMethod:
    draft = build_draft_lm(cfg.draft, target)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    return DistillMethod(target, draft, cfg.distill, cfg.seed, pad_id)


def format_report(metrics: dict[str, float], term: str, start: dict[str, float] | None = None) -> str:
    """Held-out expected acceptance, greedy agreement and loss (start -> end)."""
    start = start or {}
    labels = (
        ("expected acceptance sum min(p, q)", f"eval/{term}/accept"),
        ("greedy agreement (top-1)", f"eval/{term}/top1"),
        (f"{term} loss", f"eval/{term}/loss"),
        ("tau estimate (depth 5, i.i.d.)", "eval/tau_estimate"),
    )
    rows = [[label, start_to_end(key, metrics, start)] for label, key in labels if key in metrics]
    return "\n".join(table(["metric", "value"], rows))


def offline_target_layers(cfg: DistillRecipe) -> int:
    """How many of the target's first layers offline distillation loads: those the draft copies
    (`draft.init=target`), up to the full-attention layer a hybrid target's draft takes (`draft_layer_indices`)."""
    if cfg.draft.init != "target":
        return 0
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        cfg.target.path, revision=cfg.target.revision, trust_remote_code=cfg.target.trust_remote_code
    )
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return max(draft_layer_indices(text, cfg.draft.num_layers)) + 1


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(
            DistillRecipe,
            "draftsmith train distill",
            __doc__ or "",
            build_method,
            cache_layers,
            offline_target_layers,
        ),
        argv,
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
