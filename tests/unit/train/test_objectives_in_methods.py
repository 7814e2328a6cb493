"""The `objective:` section in every head family's training method (docs/ALGORITHMS-BLOCK.md section 3):
dense float64 oracles of the chunked loss terms with the family's alignment and D-PACE chains, tv against the
logged alpha, a few optimizer steps for every objective and weighting, and the recipe-level error line."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_llama

from draftsmith.config.loader import load_config
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import build_vocab_map
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.medusa2 import Medusa2Config, Medusa2Model
from draftsmith.models.mtp import MTPConfig, MTPDraft, shift_tokens
from draftsmith.models.objectives import OBJECTIVES, WEIGHTINGS, ObjectiveConfig
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget
from draftsmith.train import eagle as eagle_script
from draftsmith.train import medusa as medusa_script
from draftsmith.train import mtp as mtp_script
from draftsmith.train import peagle as peagle_script
from draftsmith.train.eagle import EagleMethod, _Eagle3Train, step_masks
from draftsmith.train.medusa import Medusa2Method, MedusaMethod
from draftsmith.train.mtp import MTPMethod, depth_masks

CHUNK = 4  # tokens: 2 positions of the 2-row batch, so T = 11 takes 6 chunks
T, V = 11, 13
FAMILIES = ("medusa", "eagle1", "eagle3", "mtp")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from a second thread, and on a shared 2-core machine it costs several times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    return FrozenTarget(make_tiny_llama(V, layers=4, hidden=32), SimpleNamespace(pad_token_id=0), "tiny-13")


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(2, V, (2, T), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0  # right padding
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[0, 3:] = True
    loss_mask[1, 2:9] = True
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def build(
    family: str, target: FrozenTarget, objective: ObjectiveConfig, vd: int = 0, chunk: int = CHUNK
) -> Any:
    """A method of `family` on `target` (EAGLE-3 with a draft vocabulary of `vd` tokens, 0 = all; loss chunks
    of `chunk` tokens)."""
    torch.manual_seed(0)
    if family == "medusa":
        heads = MedusaHeads(MedusaConfig(num_heads=3), target.hidden_size, V)
        heads.init_from_lm_head(target.lm_head.weight)
        with torch.no_grad():  # non-trivial ResBlocks (they start as the identity)
            for p in heads.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return MedusaMethod(target, heads, loss_chunk=chunk, objective=objective)
    if family == "eagle1":
        draft: Any = Eagle1Draft(EagleConfig(version=1, noise="none"), target.model.config, V)
    elif family == "eagle3":
        cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=3)
        draft = _Eagle3Train(cfg, target.model.config, vd or V)
        if vd:  # the target's most frequent greedy tokens: some soft labels kept, others dropped
            b = batch()
            logits = target.forward(b["input_ids"], b["attention_mask"], return_logits=True)[1]
            assert logits is not None
            greedy = logits.argmax(-1)
            draft.set_vocab_map(*build_vocab_map(torch.bincount(greedy.flatten(), minlength=V), vd))
        draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    else:
        draft = MTPDraft(MTPConfig(num_modules=2), target.model.config, V)
    draft.attach_target(target.embed_tokens, target.head)
    if family == "mtp":
        return MTPMethod(target, draft, loss_chunk=chunk, objective=objective)
    return EagleMethod(target, draft, loss_chunk=chunk, objective=objective)


def loop_loss(method: Any, sums: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loop's loss of one micro-batch: weighted term sums over their token counts."""
    return (method.term_weights * sums.float() / method.token_counts(b).clamp(min=1)).sum()


# ---- dense float64 oracles ---------------------------------------------------------------------------------


def per_position(kind: str, d: torch.Tensor, z: torch.Tensor, labels: torch.Tensor, kappa: float = 3.0):
    """`(loss, alpha)` per position from whole-vocabulary logits in float64, straight from the definitions."""
    log_q, log_p = d.double().log_softmax(-1), z.double().log_softmax(-1)
    p, q = log_p.exp(), log_q.exp()
    alpha = torch.minimum(p, q).sum(-1)
    kl = (p * (log_p - log_q)).sum(-1)
    lam = torch.exp(-kappa * alpha.detach())
    return {
        "kl": kl,
        "ce": -log_q.gather(-1, labels[..., None]).squeeze(-1),
        "tv": 1 - alpha,
        "lk_alpha": -alpha.clamp_min(1e-5).log(),
        "lk_lambda": lam * kl + (1 - lam) * (1 - alpha),
    }[kind], alpha


def dpace_loop(ce: torch.Tensor, valid: torch.Tensor, a: float) -> torch.Tensor:
    """D-PACE `[D, B, T]` with plain loops: the chain of one column is its D depths."""
    w = torch.zeros(ce.shape, dtype=torch.float64)
    D, B, L = ce.shape
    for b in range(B):
        for t in range(L):
            c, prod = [], 1.0
            for j in range(D):
                if valid[j, b, t]:
                    prod *= (1 - a) * math.exp(-float(ce[j, b, t])) + a
                c.append(prod if valid[j, b, t] else 0.0)
            for j in range(D):
                w[j, b, t] = sum(c[j:]) if valid[j, b, t] else 0.0
    return w


def shifted(x: torch.Tensor, k: int) -> torch.Tensor:
    """Column t holds x[:, t+k] (zeros past the end)."""
    return torch.cat([x[:, k:], torch.zeros_like(x[:, :k])], dim=1)


def oracle(family: str, method: Any, b: dict[str, torch.Tensor], objective: ObjectiveConfig):
    """`(sums [K], alpha [K])` computed densely: draft logits of every depth, the target distribution each
    depth is measured against, its labels, masks and (D-PACE) weights."""
    ids, target = b["input_ids"], method.target
    model: Any = method.model
    if family == "medusa":
        final = target.forward(ids, b["attention_mask"])[0]["final"]
        z = target.head(final)
        depth_logits = list(model(final))  # head k at column t predicts x_{t+k+1}: the target at column t+k
        targets = [shifted(z, k + 1) for k in range(len(depth_logits))]
        labels = [shifted(ids, k + 2) for k in range(len(depth_logits))]
        masks = [shifted(b["loss_mask"], k + 2).bool() for k in range(len(depth_logits))]
    elif family == "mtp":
        L = target.num_layers
        feats, z = target.forward(ids, b["attention_mask"], (L,), return_logits=True)
        depth_logits = list(model(feats[L], ids))
        targets = [shifted(z, k) for k in range(1, len(depth_logits) + 1)]
        labels = [shift_tokens(ids, k + 1) for k in range(1, len(depth_logits) + 1)]
        masks = depth_masks(b, len(depth_logits))
    else:
        feats, z = target.forward(ids, b["attention_mask"], (1, 2, 3, "final"), return_logits=True)
        if family == "eagle1":
            f = feats["final"]
            depth_logits = [model.logits(model(f, shift_left(ids)))]
            masks = [step_masks(b, 1)[0].clone()]
            masks[0][:, -1] = False
        else:
            depth_logits = model.unroll(torch.cat([feats[i] for i in (1, 2, 3)], -1), ids)
            masks = step_masks(b, len(depth_logits))
        t2d = getattr(model, "t2d", torch.ones(V, dtype=torch.bool))
        # step s at column t: the target at column t+s+1, over the draft vocabulary
        targets = [shifted(z, s + 1)[..., t2d] for s in range(len(depth_logits))]
        kept = [t2d[shifted(z, s + 1).argmax(-1)] for s in range(len(depth_logits))]
        masks = [m & k for m, k in zip(masks, kept, strict=True)]  # argmax outside the vocabulary: dropped
        labels = [tl.argmax(-1) for tl in targets]  # EAGLE's ce label: the target's argmax
    mask = torch.stack(masks)
    weights = mask.double()
    if objective.weighting == "dpace":
        ce = torch.stack(
            [
                F.cross_entropy(d.transpose(1, 2), y, reduction="none")
                for d, y in zip(depth_logits, labels, strict=True)
            ]
        )
        weights = dpace_loop(ce.detach(), mask, objective.dpace_alpha)
    sums, alphas = [], []
    for k, (d, tl, lab) in enumerate(zip(depth_logits, targets, labels, strict=True)):
        kind = objective.loss or ("kl" if family.startswith("eagle") else "ce")
        loss, alpha = per_position(kind, d, tl, lab, objective.lk_kappa)
        sums.append((loss * weights[k]).sum())
        alphas.append((alpha * mask[k]).sum())
    return torch.stack(sums), torch.stack(alphas)


CASES = [  # every family with a target-based objective under D-PACE, and each objective once
    ("medusa", ObjectiveConfig(loss="lk_lambda", weighting="dpace", dpace_alpha=0.4)),
    ("medusa", ObjectiveConfig(loss="ce", weighting="exp_decay")),
    ("eagle1", ObjectiveConfig(loss="lk_alpha", weighting="dpace")),
    ("eagle3", ObjectiveConfig(loss="ce", weighting="dpace")),
    ("eagle3", ObjectiveConfig(loss="kl")),
    ("mtp", ObjectiveConfig(loss="tv", weighting="dpace", dpace_alpha=0.7)),
    ("mtp", ObjectiveConfig(loss="lk_lambda", lk_kappa=1.5)),
]


@pytest.mark.parametrize(
    ("family", "objective"), CASES, ids=[f"{f}-{o.loss}-{o.weighting}" for f, o in CASES]
)
def test_chunked_terms_equal_the_dense_oracle(target, family, objective):
    method = build(family, target, objective, vd=5 if family == "eagle3" else 0)
    b = batch()
    sums, metrics = method.loss_terms(method.model, b)
    want, want_alpha = oracle(family, method, b, objective)
    cls = slice(1, 2) if family == "eagle1" else slice(None)  # EAGLE-1: the classification term
    torch.testing.assert_close(sums[cls].double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics["alpha"][cls].double(), want_alpha, rtol=1e-5, atol=1e-6)
    assert float(want_alpha.detach().min()) > 0 and float(want.detach().abs().min()) > 0  # nothing vacuous
    params = [p for p in method.model.parameters() if p.requires_grad]
    got = torch.autograd.grad(sums[cls].sum(), params, allow_unused=True)
    wanted = torch.autograd.grad(want.sum(), params, allow_unused=True)
    for g, w in zip(got, wanted, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-7)


def test_term_weights_follow_the_weighting(target):
    """fixed: each family's own constants; exp_decay: exp(-(k-1)/gamma); dpace: 1 per depth (its weights are per
    position); times the coefficient that is not a depth weight (EAGLE-1's cls_weight, MTP's loss_weight)."""
    fixed = {
        "medusa": torch.tensor([0.8, 0.64, 0.512]),
        "eagle1": torch.tensor([1.0, 0.1]),
        "eagle3": torch.tensor([1.0, 0.8, 0.64]),
        "mtp": torch.tensor([0.5, 0.5]),
    }
    decay = ObjectiveConfig(weighting="exp_decay", decay_gamma=2.0)
    e = torch.exp(-torch.arange(3) / 2.0)
    for family in FAMILIES:
        torch.testing.assert_close(build(family, target, ObjectiveConfig()).term_weights, fixed[family])
        got = build(family, target, decay).term_weights
        dpace = build(family, target, ObjectiveConfig(weighting="dpace")).term_weights
        if family == "eagle1":  # one depth (exp(0) = 1): cls_weight stays, the regression term is untouched
            torch.testing.assert_close(got, fixed[family])
            torch.testing.assert_close(dpace, fixed[family])
        else:
            torch.testing.assert_close(got, e[: len(got)])
            torch.testing.assert_close(dpace, torch.ones(len(got)))
    draft = MTPDraft(MTPConfig(num_modules=2, loss_weight=0.3), target.model.config, V)
    torch.testing.assert_close(MTPMethod(target, draft, objective=decay).term_weights, 0.3 * e[:2])
    m2 = medusa2(decay)  # heads_coefficient 0.2 times the decay; the base term keeps weight 1
    torch.testing.assert_close(m2.term_weights, torch.cat([torch.ones(1), 0.2 * e[:2]]))


@pytest.mark.parametrize("family", FAMILIES)
def test_tv_is_one_minus_the_logged_mean_alpha(target, family):
    """tv's term mean (sum over the term's tokens) equals 1 - the logged alpha of the same term."""
    method = build(family, target, ObjectiveConfig(loss="tv"))
    b = batch()
    sums, metrics = method.loss_terms(method.model, b)
    counts = method.token_counts(b)
    terms = [1] if family == "eagle1" else range(len(sums))
    for i in terms:
        assert float(counts[i]) > 0
        mean_tv = float(sums[i].detach() / counts[i])
        assert mean_tv == pytest.approx(1 - float(metrics["alpha"][i] / counts[i]), abs=1e-6)


def medusa2(objective: ObjectiveConfig) -> Medusa2Method:
    torch.manual_seed(0)
    llama = make_tiny_llama(V, layers=2, hidden=32)
    heads = MedusaHeads(MedusaConfig(num_heads=2), 32, V)
    heads.init_from_lm_head(llama.lm_head.weight)
    cfg = Medusa2Config(enabled=True, lora_r=4)
    return Medusa2Method(Medusa2Model(llama, heads, cfg), cfg, objective)


def test_medusa2_heads_are_measured_against_the_adapted_backbone():
    method = medusa2(ObjectiveConfig(loss="tv"))
    b = batch()
    sums, metrics = method.loss_terms(method.model, b)
    counts = method.token_counts(b)
    with torch.no_grad():
        adapted, heads, _ = method.model(b["input_ids"], b["attention_mask"])
    for k in range(2):  # head k (1-based k+1) at column t: the adapted backbone's distribution at t+k+1
        m = shifted(b["loss_mask"], k + 2).bool()
        p, q = torch.softmax(shifted(adapted, k + 1), -1), torch.softmax(heads[k], -1)
        alpha = (torch.minimum(p, q).sum(-1) * m).sum()
        assert float(metrics["alpha"][k + 1]) == pytest.approx(float(alpha), rel=1e-5)
        mean_tv = float(sums[k + 1].detach() / counts[k + 1])
        assert mean_tv == pytest.approx(1 - float(alpha / counts[k + 1]), abs=1e-6)


def train_steps(method: Any, steps: int = 2) -> list[float]:
    params = [p for p in method.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(steps):
        b = batch()
        sums, metrics = method.loss_terms(method.model, b)
        loss = loop_loss(method, sums, b)
        assert all(bool(v.isfinite().all()) for v in metrics.values())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert any(not torch.equal(p, q) for p, q in zip(params, before, strict=True))  # it trained
    return losses


OPTIONS = [(loss, w) for loss in (None, *OBJECTIVES) for w in WEIGHTINGS]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_objective_and_weighting_trains(target, family):
    """Two optimizer steps for each (objective, weighting); one loss chunk (chunking is the oracles' job)."""
    for loss, weighting in OPTIONS:
        method = build(family, target, ObjectiveConfig(loss=loss, weighting=weighting), vd=7, chunk=2 * T)
        losses = train_steps(method)
        assert all(math.isfinite(x) for x in losses), (family, loss, weighting, losses)


def test_medusa2_trains_with_every_objective_and_every_weighting():
    """Each objective once, the weightings in turn (the live backbone makes Medusa-2 the slowest family)."""
    for i, loss in enumerate((None, *OBJECTIVES)):
        weighting = WEIGHTINGS[i % len(WEIGHTINGS)]
        losses = train_steps(medusa2(ObjectiveConfig(loss=loss, weighting=weighting)))
        assert all(math.isfinite(x) for x in losses), (loss, weighting, losses)


class _SizedTokenizer(SimpleNamespace):
    def __len__(self) -> int:
        return V


@pytest.mark.parametrize("script", [medusa_script, eagle_script, mtp_script, peagle_script])
def test_recipes_read_the_section_and_methods_get_it(target, script, monkeypatch):
    cfg = load_config(script.RECIPE, None, ["objective.loss=lk_lambda", "objective.weighting=dpace"])
    if script is medusa_script:
        cfg.draft.num_heads = 2
    if script in (eagle_script, peagle_script):
        cfg.draft.feature_layers = [1, 2, 3]  # the 4-layer target has no default taps
    if script is peagle_script:  # P-EAGLE picks its mask token by the tokenizer's length
        monkeypatch.setattr(target, "tokenizer", _SizedTokenizer(**vars(target.tokenizer)))
    method = script.build_method(cfg, target, SimpleNamespace(train=[]))
    assert method.objective == ObjectiveConfig(loss="lk_lambda", weighting="dpace")


@pytest.mark.parametrize("script", [medusa_script, eagle_script, mtp_script, peagle_script])
def test_a_bad_objective_is_one_error_line(script, capsys):
    with pytest.raises(SystemExit) as info:
        script.main(["target.path=unused", "objective.loss=foo"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(lines) == 1
    assert "objective.loss" in lines[0] and "'lk_lambda'" in lines[0] and "foo" in lines[0]
