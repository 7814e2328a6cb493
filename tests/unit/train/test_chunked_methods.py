"""Every method's chunked loss (logits and soft labels computed a few positions at a time, recomputed in
backward) against a slow oracle that computes the whole [B, T, V] logits at once, the way the training
scripts did before: the same sums, metrics and gradients, and no vocabulary-sized activation kept for backward."""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_llama

from draftsmith.eval.drafters.ngram import NgramDrafter
from draftsmith.models.divergences import divergence
from draftsmith.models.draft_lm import DraftLMConfig, build_draft_lm
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import build_vocab_map
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.mtp import MTPConfig, MTPDraft, shift_tokens
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget, feature_key
from draftsmith.train.distill import DistillConfig, DistillMethod
from draftsmith.train.eagle import EagleMethod, _Eagle3Train, step_masks
from draftsmith.train.medusa import MedusaMethod
from draftsmith.train.mtp import MTPMethod, depth_masks

CHUNK = 4  # tokens: 2 positions of the 2-row batch, so T = 11 takes 6 chunks, the last one short
T = 11


@pytest.fixture(scope="module")
def small_target() -> FrozenTarget:
    """A random target with 13 tokens (no other dimension here is 13), so that random drafters agree with the
    data and the target often enough for the top-1 / agreement counts to check the alignment too."""
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)  # only distillation's stop ids read it
    return FrozenTarget(make_tiny_llama(13, layers=4, hidden=32), tokenizer, "tiny-13")


def batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (2, T), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0  # right padding
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[0, 3:] = True
    loss_mask[1, 2:9] = True
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def loop_loss(method: Any, sums: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loop's loss of one micro-batch: weighted term sums over their token counts."""
    return (method.term_weights * sums.float() / method.token_counts(b).clamp(min=1)).sum()


def trainable(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def assert_rel_close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-6) -> None:
    scale = float(want.detach().abs().max())
    assert float((got.detach() - want.detach()).abs().max()) <= rel * max(scale, 1e-30), (got, want)


def overlap(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p, q) per position, the acceptance probability every method logs (dense)."""
    return torch.minimum(torch.softmax(target_logits, -1), torch.softmax(draft_logits, -1)).sum(-1)


def check(
    method: Any, b: dict[str, torch.Tensor], oracle: Callable[[], tuple[torch.Tensor, dict]], vocab: set[int]
) -> None:
    """The chunked loss terms, metrics and gradients equal the oracle's; no activation with a vocabulary-sized
    dimension is saved for backward outside the recomputed chunks (weights, e.g. a transposed LM head, are
    saved as views of the parameters and cost nothing)."""
    params = trainable(method.model)
    weights = {p.untyped_storage().data_ptr() for p in method.model.parameters()}
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sums, metrics = method.loss_terms(method.model, b)
    assert not [s for s in saved if set(s) & vocab], saved
    grads = torch.autograd.grad(loop_loss(method, sums, b), params, allow_unused=True)
    want_sums, want_metrics = oracle()
    want_grads = torch.autograd.grad(loop_loss(method, want_sums, b), params, allow_unused=True)
    assert_rel_close(sums, want_sums)
    assert metrics.keys() == want_metrics.keys()
    for name, value in metrics.items():
        assert_rel_close(value, want_metrics[name])
        assert float(value.sum()) > 0, name  # an all-zero count would check nothing
    assert sum(g is not None for g in grads) == len(params)  # every parameter is trained
    for got, want in zip(grads, want_grads, strict=True):
        assert_rel_close(got, want)


def test_medusa(small_target):
    target = small_target
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(num_heads=3), target.hidden_size, target.vocab_size)
    heads.init_from_lm_head(target.lm_head.weight)
    with torch.no_grad():  # non-trivial ResBlocks (they start as the identity)
        for p in heads.parameters():
            p.add_(0.05 * torch.randn_like(p))
    method = MedusaMethod(target, heads, loss_chunk=CHUNK)
    b = batch(target.vocab_size)

    def oracle() -> tuple[torch.Tensor, dict]:
        final = target.forward(b["input_ids"], b["attention_mask"])[0]["final"]
        logits = heads(final)  # [K, B, T, V]
        z = target.head(
            final
        )  # the target's logits; head k (1-based) at column t is measured against column t+k
        sums, top1, top5, alpha = [], [], [], []
        for k in range(3):
            shift = k + 2
            lg, tgt, m = logits[k, :, : T - shift], b["input_ids"][:, shift:], b["loss_mask"][:, shift:]
            sums.append((F.cross_entropy(lg.transpose(1, 2), tgt, reduction="none") * m).sum())
            hit = lg.topk(5, -1).indices == tgt[..., None]
            top1.append((hit[..., 0] & m).sum().float())
            top5.append((hit.any(-1) & m).sum().float())
            alpha.append((overlap(z[:, k + 1 : T - 1], lg) * m).sum())
        return torch.stack(sums), {
            "top1": torch.stack(top1),
            "top5": torch.stack(top5),
            "alpha": torch.stack(alpha),
        }

    check(method, b, oracle, {target.vocab_size})


def test_eagle1(small_target):
    target = small_target
    torch.manual_seed(0)
    draft = Eagle1Draft(EagleConfig(version=1, noise="none"), target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    method = EagleMethod(target, draft, loss_chunk=CHUNK)
    b = batch(target.vocab_size)

    def oracle() -> tuple[torch.Tensor, dict]:
        f = target.forward(b["input_ids"], b["attention_mask"])[0]["final"]
        predicted = draft(f, shift_left(b["input_ids"]))
        q, z = draft.logits(predicted)[:, :-1], target.head(f)[:, 1:]
        m = step_masks(b, 1)[0][:, :-1].float()
        reg = F.smooth_l1_loss(predicted[:, :-1], f[:, 1:], reduction="none").mean(-1)
        cls = -(torch.softmax(z, -1) * torch.log_softmax(q, -1)).sum(-1)
        top1 = ((q.argmax(-1) == z.argmax(-1)).float() * m).sum()
        alpha = (overlap(z, q) * m).sum()
        metrics = {"top1": torch.stack([top1, top1]), "alpha": torch.stack([alpha, alpha])}
        return torch.stack([(reg * m).sum(), (cls * m).sum()]), metrics

    check(method, b, oracle, {target.vocab_size})


def reduced_vocab_eagle3(target, config: EagleConfig, vd: int):
    """An EAGLE-3 draft of `vd` tokens, its method and a batch. The draft vocabulary: the target's most frequent
    greedy tokens on the batch, so that some soft labels are kept and others (argmax outside the vocabulary)
    dropped; the head starts as the target's rows."""
    torch.manual_seed(0)
    draft = _Eagle3Train(config, target.model.config, vd)
    b = batch(target.vocab_size)
    greedy = target.forward(b["input_ids"], b["attention_mask"], return_logits=True)[1].argmax(-1)
    draft.set_vocab_map(*build_vocab_map(torch.bincount(greedy.flatten(), minlength=target.vocab_size), vd))
    draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    draft.attach_target(target.embed_tokens, target.head)
    return draft, EagleMethod(target, draft, loss_chunk=CHUNK), b


def copy_oracle(ids: torch.Tensor, real: torch.Tensor, steps: int, weight: float) -> list[torch.Tensor]:
    """Per step `[B, T]`: 1 + weight where the evaluator's prompt lookup drafts the data's token x_{t+s+2} from
    x_{<=t+s+1}, 1 elsewhere (a per-position loop over the slow reference)."""
    lookup, out = NgramDrafter(), []
    for s in range(steps):
        w = torch.ones(ids.shape)
        for r in range(ids.shape[0]):
            for t in range(ids.shape[1]):
                k = t + s + 2
                inside = k < ids.shape[1] and bool(real[r, k])
                if inside and lookup.continuations(ids[r, :k].tolist(), 1, 1) == [[int(ids[r, k])]]:
                    w[r, t] += weight
        out.append(w)
    return out


@pytest.mark.parametrize("copy_weight", [0.0, 3.0])
def test_eagle3_with_a_reduced_draft_vocabulary(small_target, copy_weight):
    """Soft labels over a reduced draft vocabulary; `draft.copy_weight` (on text whose second half repeats its
    first) weighs the columns whose data token prompt lookup drafts."""
    target, steps, vd = small_target, 3, 5
    config = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=steps, copy_weight=copy_weight)
    draft, method, b = reduced_vocab_eagle3(target, config, vd)
    b["input_ids"][:, T // 2 : 2 * (T // 2)] = b["input_ids"][:, : T // 2].clone()
    weights = copy_oracle(b["input_ids"], b["attention_mask"].bool(), steps, copy_weight)
    assert copy_weight == 0 or any((w > 1).any() for w in weights)

    def oracle() -> tuple[torch.Tensor, dict]:
        feats, logits = target.forward(b["input_ids"], b["attention_mask"], (1, 2, 3), return_logits=True)
        step_logits = draft.unroll(torch.cat([feats[i] for i in (1, 2, 3)], -1), b["input_ids"])
        z = shift_left(logits)
        sums, hits, alpha = [], [], []
        for s, m in enumerate(step_masks(b, steps)):
            pm = m.float() * draft.t2d[z.argmax(-1)].float()
            p = torch.softmax(z[..., draft.t2d], -1)
            sums.append((-(p * torch.log_softmax(step_logits[s], -1)).sum(-1) * pm * weights[s]).sum())
            hits.append(((step_logits[s].argmax(-1) == p.argmax(-1)).float() * pm).sum())
            alpha.append((overlap(z[..., draft.t2d], step_logits[s]) * pm).sum())  # kept positions only
            z = shift_left(z)
        return torch.stack(sums), {"top1": torch.stack(hits), "alpha": torch.stack(alpha)}

    check(method, b, oracle, {target.vocab_size, vd})


def test_eagle3_trains_only_the_columns_its_drafts_reach(small_target):
    """`draft.reach_topk: 2` (GRIFFIN) on soft labels: step s's loss keeps a column only where each earlier
    step's label (the target's argmax, in the draft vocabulary) was among the draft's top 2 there; the hits and
    alpha stay teacher-forced."""
    target, steps = small_target, 3
    config = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=steps, reach_topk=2)
    vd = 5
    draft, method, b = reduced_vocab_eagle3(target, config, vd)
    dropped = []

    def oracle() -> tuple[torch.Tensor, dict]:
        feats, logits = target.forward(b["input_ids"], b["attention_mask"], (1, 2, 3), return_logits=True)
        step_logits = draft.unroll(torch.cat([feats[i] for i in (1, 2, 3)], -1), b["input_ids"])
        z, reached = shift_left(logits), torch.ones(b["input_ids"].shape, dtype=torch.bool)
        sums, hits, alpha = [], [], []
        for s, m in enumerate(step_masks(b, steps)):
            kept = draft.t2d[z.argmax(-1)]
            pm = m.float() * kept.float()
            p = torch.softmax(z[..., draft.t2d], -1)
            sums.append((-(p * torch.log_softmax(step_logits[s], -1)).sum(-1) * pm * reached).sum())
            hits.append(((step_logits[s].argmax(-1) == p.argmax(-1)).float() * pm).sum())
            alpha.append((overlap(z[..., draft.t2d], step_logits[s]) * pm).sum())
            dropped.append(int((m & kept & ~reached).sum()))
            top2 = step_logits[s].topk(2, -1).indices
            reached = reached & kept & (top2 == p.argmax(-1, keepdim=True)).any(-1)
            z = shift_left(z)
        return torch.stack(sums), {"top1": torch.stack(hits), "alpha": torch.stack(alpha)}

    check(method, b, oracle, {target.vocab_size, vd})
    assert sum(dropped) > 0  # the mask removed some trained columns from later steps


@pytest.mark.parametrize("copy_weight", [0.0, 3.0])
def test_eagle3_on_the_data_s_next_tokens(small_target, copy_weight):
    """`draft.labels: data`: each step's cross-entropy on the data's token x_{t+s+2}, against a per-position
    loop; labels outside the reduced draft vocabulary dropped, positions without a label token not counted.
    `draft.copy_weight`: a label the evaluator's prompt lookup drafts after x_{<=t+s+1} weighs 1 + copy_weight
    (on text whose second half repeats its first)."""
    target = small_target
    torch.manual_seed(0)
    vd, steps = 5, 3
    cfg = EagleConfig(
        version=3, feature_layers=[1, 2, 3], ttt_steps=steps, labels="data", copy_weight=copy_weight
    )
    draft = _Eagle3Train(cfg, target.model.config, vd)
    b = batch(target.vocab_size)
    if copy_weight:
        b["input_ids"][:, T // 2 : 2 * (T // 2)] = b["input_ids"][:, : T // 2].clone()
    ids, real = b["input_ids"], b["attention_mask"].bool()
    lookup = NgramDrafter()
    copied: list[int] = []
    draft.set_vocab_map(*build_vocab_map(torch.bincount(ids.flatten(), minlength=target.vocab_size), vd))
    draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    draft.attach_target(target.embed_tokens, target.head)
    method = EagleMethod(target, draft, loss_chunk=CHUNK)
    to_draft = {int(t): i for i, t in enumerate(draft.to_target_ids(torch.arange(vd)))}
    assert len(set(ids[real].tolist()) - set(to_draft)) > 0  # some labels fall outside the vocabulary

    def oracle() -> tuple[torch.Tensor, dict]:
        feats, _ = target.forward(ids, b["attention_mask"], (1, 2, 3))
        step_logits = draft.unroll(torch.cat([feats[i] for i in (1, 2, 3)], -1), ids)
        sums, hits, alpha, counts = [], [], [], []
        for s, m in enumerate(step_masks(b, steps)):
            loss, hit, a, n = torch.zeros(()), 0.0, 0.0, 0
            for r in range(ids.shape[0]):
                for t in range(T):
                    k = t + s + 2
                    if not (m[r, t] and k < T and real[r, k]):
                        continue
                    n += 1
                    if int(ids[r, k]) not in to_draft:
                        continue
                    label = to_draft[int(ids[r, k])]
                    log_q = torch.log_softmax(step_logits[s][r, t], -1)
                    weight = 1.0
                    if lookup.continuations(ids[r, :k].tolist(), 1, 1) == [[int(ids[r, k])]]:
                        weight += copy_weight
                        copied.append(k)
                    loss = loss - weight * log_q[label]
                    hit += float(int(log_q.argmax()) == label)
                    a += float(log_q[label].detach().exp())
            sums.append(loss)
            hits.append(hit)
            alpha.append(a)
            counts.append(n)
        assert method.token_counts(b).tolist() == counts
        return torch.stack(sums), {"top1": torch.tensor(hits), "alpha": torch.tensor(alpha)}

    check(method, b, oracle, {target.vocab_size, vd})
    assert copied or not copy_weight  # the repeat put some copies in the loss
    if copy_weight:  # held-out batches (the drafter in eval mode) keep the unweighted loss
        method.model.eval()
        held_out, _ = method.loss_terms(method.model, b)
        cfg.copy_weight = 0.0
        plain, _ = method.loss_terms(method.model, b)
        assert torch.equal(held_out, plain)


def test_eagle3_on_the_target_s_greedy_tokens(small_target):
    """`draft.labels: top1`: each step's cross-entropy on the target's own argmax at position t+s+1 (the label a
    cache stores as `feat.top1`), against a per-position loop over the target's full logits; the online path
    (top1 computed here) and the cached one (top1 in the batch, features rounded to bf16 as a cache stores them)
    give the same loss."""
    target = small_target
    torch.manual_seed(0)
    vd, steps = 5, 3
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=steps, labels="top1")
    draft = _Eagle3Train(cfg, target.model.config, vd)
    b = batch(target.vocab_size)
    ids = b["input_ids"]
    greedy = target.forward(ids, b["attention_mask"], return_logits=True)[1].argmax(-1)
    draft.set_vocab_map(*build_vocab_map(torch.bincount(greedy.flatten(), minlength=target.vocab_size), vd))
    draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    draft.attach_target(target.embed_tokens, target.head)
    method = EagleMethod(target, draft, loss_chunk=CHUNK)
    to_draft = {int(t): i for i, t in enumerate(draft.to_target_ids(torch.arange(vd)))}
    assert (greedy[:, :-1] != ids[:, 1:]).any()  # the data is not the target's: the labels differ from data's

    def oracle() -> tuple[torch.Tensor, dict]:
        feats, logits = target.forward(ids, b["attention_mask"], (1, 2, 3), return_logits=True)
        step_logits = draft.unroll(torch.cat([feats[i] for i in (1, 2, 3)], -1), ids)
        sums, hits, alpha = [], [], []
        for s, m in enumerate(step_masks(b, steps)):
            loss, hit, a = torch.zeros(()), 0.0, 0.0
            for r, t in m.nonzero().tolist():
                token = int(logits[r, t + s + 1].argmax())  # the target's prediction of x_{t+s+2}
                if token not in to_draft:
                    continue
                log_q = torch.log_softmax(step_logits[s][r, t], -1)
                loss = loss - log_q[to_draft[token]]
                hit += float(int(log_q.argmax()) == to_draft[token])
                a += float(log_q[to_draft[token]].detach().exp())
            sums.append(loss)
            hits.append(hit)
            alpha.append(a)
        assert method.token_counts(b).tolist() == [float(m.sum()) for m in step_masks(b, steps)]
        return torch.stack(sums), {"top1": torch.tensor(hits), "alpha": torch.tensor(alpha)}

    check(method, b, oracle, {target.vocab_size, vd})
    online, _ = method.loss_terms(method.model, b)
    feats, _ = target.forward(ids, b["attention_mask"], (1, 2, 3, "top1"))
    cached = {**b, **{feature_key(lid): f for lid, f in feats.items()}}
    torch.testing.assert_close(method.loss_terms(method.model, cached)[0], online)
    assert torch.equal(feats["top1"], greedy)


def test_mtp(small_target):
    target = small_target
    torch.manual_seed(0)
    draft = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    method = MTPMethod(target, draft, loss_chunk=CHUNK)
    b = batch(target.vocab_size)
    ids = b["input_ids"]

    def oracle() -> tuple[torch.Tensor, dict]:
        L = target.num_layers
        feats, logits = target.forward(ids, b["attention_mask"], (L,), return_logits=True)
        sums, top1, agree, alpha = [], [], [], []
        for k, (lg, m) in enumerate(zip(draft(feats[L], ids), depth_masks(b, 2), strict=True), start=1):
            labels, picked = shift_tokens(ids, k + 1)[m], lg[m]
            sums.append(F.cross_entropy(picked, labels, reduction="sum"))
            top1.append((picked.argmax(-1) == labels).sum().float())
            agree.append((picked.argmax(-1) == shift_tokens(logits.argmax(-1), k)[m]).sum().float())
            alpha.append(overlap(logits[:, k:][m[:, : T - k]], picked).sum())  # the target at column i+k
        metrics = {"top1": torch.stack(top1), "agree": torch.stack(agree), "alpha": torch.stack(alpha)}
        return torch.stack(sums), metrics

    check(method, b, oracle, {target.vocab_size})


@pytest.mark.parametrize("kind", ["fkl", "ce"])
def test_distill(small_target, kind):
    # In float64: a KL of nearly equal distributions is a small difference of large terms, so float32 logits
    # that differ in the last bit (one matmul over all positions vs one per chunk) move it by ~1e-5. The
    # divergence itself still runs in float32 on both sides.
    base = small_target
    target = FrozenTarget(copy.deepcopy(base.model).double(), base.tokenizer, base.name_or_path)
    torch.manual_seed(0)
    draft = build_draft_lm(DraftLMConfig(init="scratch", num_layers=1), target)
    cfg = DistillConfig(divergence=kind, temperature=1.5, vocab_chunk=64)
    method = DistillMethod(target, draft, cfg, seed=0, pad_id=0, loss_chunk=CHUNK)
    b = batch(target.vocab_size)

    def oracle() -> tuple[torch.Tensor, dict]:
        """The whole [B, T, V] logits of both models, then the divergence on the answer positions."""
        m = shift_left(b["loss_mask"]).bool()
        q = draft(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[m]
        p = target.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[m].detach()
        div, accept = divergence(p, q, "tvd" if kind == "ce" else kind, temperature=1.5, vocab_chunk=64)
        if kind == "ce":
            loss = F.cross_entropy(q, shift_left(b["input_ids"])[m], reduction="sum")
        else:
            loss = div.sum()
        top1 = (q.argmax(-1) == p.argmax(-1)).sum().float()
        return loss.reshape(1), {"accept": accept.sum().reshape(1), "top1": top1.reshape(1)}

    check(method, b, oracle, {target.vocab_size})
