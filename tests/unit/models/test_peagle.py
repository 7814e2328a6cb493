"""P-EAGLE against docs/ALGORITHMS-BLOCK.md section 2 and its test oracle 8: COD sampling invariants, the
item mask against the rule written out, train/infer parity, the loss alignment, the mask-token choice, and a
short run through `draftsmith train peagle`."""

from __future__ import annotations

import math
import types

import pytest
import torch
from conftest import make_tiny_llama

from draftsmith.eval.drafters.peagle import PEagleDrafter
from draftsmith.eval.tree import parse_tree
from draftsmith.models.losses import eagle3_step_loss
from draftsmith.models.peagle import PEagleConfig, PEagleDraft, cod_sample, item_mask, pick_mask_token
from draftsmith.train.eagle import step_masks
from draftsmith.train.peagle import PEagleMethod, batch_items, depth_loss, item_dpace_weights, item_targets

V, H = 48, 32


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1 + noise if p.ndim == 1 and "norm" in name else noise)


@pytest.fixture(scope="module")
def llama():
    return make_tiny_llama(V, layers=4, hidden=H)


def peagle(llama, layers: int = 2, depths: int = 3, vd: int = V) -> PEagleDraft:
    cfg = PEagleConfig(
        feature_layers=[1, 2, 3],
        num_layers=layers,
        num_depths=depths,
        mask_token_id=5,
        mask_embedding="learned",
    )
    draft = PEagleDraft(cfg, llama.config, vd)
    _randomize(draft, 1)
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    return draft.eval()


# ---- COD sampling (oracle 8) ------------------------------------------------------------------------------


def _trained(S: int, seed: int) -> torch.Tensor:
    m = torch.rand(S, generator=torch.Generator().manual_seed(seed)) < 0.7
    m[-1] = False  # the last column has no real next position
    return m


@pytest.mark.parametrize("seed", range(6))
def test_cod_items_extend_chains_and_follow_the_schedule(seed):
    S, D, r, r_min = 40, 6, 0.8, 0.3
    trained = _trained(S, seed)
    anchors, depths, _ = cod_sample(trained, D, r, r_min, torch.Generator().manual_seed(seed))
    items = list(zip(anchors.tolist(), depths.tolist(), strict=True))
    assert items[:S] == [(t, 0) for t in range(S)]  # depth 0: every column, in order
    assert depths.tolist() == sorted(depths.tolist())  # depth-major: a parent comes before its children
    M = int(trained.sum())
    prev = {t for t in range(S) if trained[t]}
    for d in range(1, D):
        picked = [a + d for a, k in items if k == d]
        cand = {t for t in prev if t >= d}
        expected = min(math.floor((M - d) * max(r**d, r_min)), len(cand))
        assert len(picked) == max(expected, 0), d
        assert set(picked) <= cand and picked == sorted(picked)
        for a, k in items:
            if k == d:
                assert (a, d - 1) in items and trained[a + d]  # the rollout's parent exists; a+d is trained
        prev = {t + 1 for t in picked if t + 1 < S and trained[t + 1]}
    again = cod_sample(trained, D, r, r_min, torch.Generator().manual_seed(seed))
    assert torch.equal(again[0], anchors) and torch.equal(again[1], depths)  # reproducible from the seed


def test_cod_with_ratio_one_keeps_every_chain():
    trained = torch.ones(10, dtype=torch.bool)
    trained[-1] = False
    anchors, depths, _ = cod_sample(trained, 4, 1.0, 0.0, torch.Generator().manual_seed(0))
    want = {(a, d) for d in range(4) for a in range(10) if d == 0 or a + d <= 8}
    assert set(zip(anchors.tolist(), depths.tolist(), strict=True)) == want


# ---- the item mask against the rule ---------------------------------------------------------------------


def test_item_mask_equals_the_rule_pair_by_pair():
    anchors, depths, _ = cod_sample(_trained(12, 3), 4, 0.7, 0.2, torch.Generator().manual_seed(1))
    n = anchors.numel()
    pad = 3
    A = torch.cat([anchors, torch.zeros(pad, dtype=torch.long)])[None]
    Dp = torch.cat([depths, torch.zeros(pad, dtype=torch.long)])[None]
    valid = torch.arange(n + pad)[None] < n
    mask = item_mask(A, Dp, valid)[0, 0]
    for q in range(n + pad):
        for k in range(n + pad):
            if q >= n or k >= n:
                want = q == k  # padding sees only itself; nothing sees padding
            else:
                aq, dq, ak, dk = anchors[q], depths[q], anchors[k], depths[k]
                want = bool((dk == 0 and ak <= aq) or (ak == aq and dk <= dq))
            assert bool(mask[q, k]) == want, (q, k)


# ---- train / infer parity -------------------------------------------------------------------------------


@torch.no_grad()
def test_training_items_equal_one_pass_inference(llama):
    """Items (a, 0..D-1) of the parallel training forward == the evaluator's one pass after the root x_{a+1},
    fed incrementally as in decoding (the cache keeps only real pairs between passes)."""
    draft, T, D = peagle(llama), 12, 3
    g, ids = torch.randn(1, T, 3 * H), torch.randint(0, V, (1, T))
    trained = torch.ones(T, dtype=torch.bool)
    trained[-1] = False
    anchors, depths, _ = cod_sample(trained, D, 1.0, 0.0, torch.Generator())
    logits = draft.logits(
        draft(g, ids, anchors[None], depths[None], torch.ones(1, anchors.numel(), dtype=torch.bool))
    )[0]
    drafter = PEagleDrafter(draft)
    drafter.start()
    seen = 0
    for a in (1, 2, 5, 9):  # the root after column a is x_{a+1}; features of columns 0..a
        drafter.observe({i: g[0, seen : a + 1, (i - 1) * H : i * H] for i in (1, 2, 3)})
        seen = a + 1
        depth = min(D, T - 1 - a)
        ours = drafter.chain_logits(ids[0, : a + 2].tolist(), depth)
        assert drafter.cache.get_seq_length() == a + 1  # real pairs only
        for d in range(depth):
            row = int(((anchors == a) & (depths == d)).nonzero())
            torch.testing.assert_close(ours[d], logits[row], atol=5e-5, rtol=1e-4)  # fp32, other order


def test_the_drafter_refuses_trees_and_depths_beyond_training(llama):
    drafter = PEagleDrafter(peagle(llama))
    with pytest.raises(ValueError, match="one chain per pass.*use --tree chain"):
        drafter.propose([1, 2], parse_tree("topk:2", 2), None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 3 tokens"):
        drafter.propose([1, 2], parse_tree("chain", 4), None, None)  # type: ignore[arg-type]


def test_a_real_token_equal_to_the_mask_id_is_embedded_as_itself(llama):
    draft = peagle(llama)
    ids = torch.tensor([[5, 5, 7]])
    emb = draft.embed(ids, torch.tensor([[False, True, False]]), torch.float32)
    table = llama.get_input_embeddings().weight
    assert torch.equal(emb[0, 0], table[5]) and torch.equal(emb[0, 1], draft.mask_embedding.detach())
    assert not torch.equal(table[5], draft.mask_embedding.detach())


# ---- the loss: alignment and EAGLE-3's semantics --------------------------------------------------------


def test_item_labels_are_eagle3s_step_d_at_column_a():
    """Hand-checked: T = 6, trained tokens x_1..x_3, all real. Item (a, d) predicts x_{a+d+2}: its label is the
    target's distribution at column a+d+1, and it trains iff x_{a+d} is trained and a+d+1 is real, which is
    EAGLE-3's TTT step d at column a (train/eagle.py `step_masks`)."""
    batch = {
        "input_ids": torch.zeros(1, 6, dtype=torch.long),
        "loss_mask": torch.tensor([[0, 1, 1, 1, 0, 0]]),
        "attention_mask": torch.ones(1, 6, dtype=torch.long),
        "items_anchor": torch.tensor([[0, 1, 2, 1, 2, 4, 1]]),
        "items_depth": torch.tensor([[0, 0, 0, 1, 1, 0, 2]]),
        "items_valid": torch.tensor([[True, True, True, True, True, True, False]]),
    }
    weights, columns = item_targets(batch)
    assert columns.tolist() == [[1, 2, 3, 3, 4, 5, 4]]
    # (0,0): x_0 untrained; (1,0), (2,0): x_1, x_2; (1,1): x_2; (2,1): x_3; (4,0): x_4 untrained; padding never.
    assert weights.tolist() == [[False, True, True, True, True, False, False]]
    masks = step_masks(batch, 3)
    for j, (a, d) in enumerate(
        zip(batch["items_anchor"][0].tolist(), batch["items_depth"][0].tolist(), strict=True)
    ):
        if batch["items_valid"][0, j]:
            assert bool(weights[0, j]) == bool(masks[d][0, a])


def test_depth_loss_equals_eagle3_step_loss_per_depth():
    g = torch.Generator().manual_seed(0)
    B, c, Vd, D = 2, 7, 20, 3
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V, generator=g)[:Vd]] = True
    draft_logits, target_logits = torch.randn(B, c, Vd, generator=g), 3 * torch.randn(B, c, V, generator=g)
    weights = torch.rand(B, c, generator=g) < 0.8
    depths = torch.randint(0, D, (B, c), generator=g)
    sums, counts, metrics = depth_loss(draft_logits, target_logits, weights, depths, t2d, D)
    for d in range(D):
        loss, count, hit, _ = eagle3_step_loss(draft_logits, target_logits, weights & (depths == d), t2d)
        torch.testing.assert_close(sums[d], loss)
        assert counts[d] == count and metrics["top1"][d] == hit
    perfect = depth_loss(target_logits[..., t2d], target_logits, weights, depths, t2d, D)[2]["top1"]
    kept = t2d[target_logits.argmax(-1)] & weights
    assert perfect.tolist() == [float((kept & (depths == d)).sum()) for d in range(D)]


def test_method_terms_count_each_depths_items(tiny_random_target):
    target = tiny_random_target
    cfg = PEagleConfig(
        feature_layers=[1, 2, 3], num_layers=2, num_depths=3, mask_token_id=0, mask_embedding="frozen"
    )
    draft = PEagleDraft(cfg, target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    method = PEagleMethod(target, draft, seed=0, loss_chunk=16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (2, 20), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    batch["attention_mask"][1, 15:] = 0
    batch["loss_mask"][1, 15:] = 0
    prepared = method.prepare_batch(draft, batch, step=3, micro_batch=0, rank=0)
    # A row draws the same items alone as beside another row (the rank / micro-batch split does not matter).
    alone = batch_items({k: v[1:] for k, v in batch.items()}, cfg, 0, 3)
    n = int(alone["items_valid"].sum())
    assert torch.equal(prepared["items_anchor"][1, :n], alone["items_anchor"][0, :n])
    counts = method.token_counts(prepared)
    weights, _ = item_targets(prepared)
    assert counts.tolist() == [float((weights & (prepared["items_depth"] == d)).sum()) for d in range(3)]
    assert counts[0] == 19 + 14 and 0 < counts[2] < counts[1] < counts[0]
    sums, metrics = method.loss_terms(draft, prepared)
    assert sums.shape == (3,) and torch.isfinite(sums).all() and (metrics["top1"] <= counts).all()


# ---- D-PACE on COD items ---------------------------------------------------------------------------------


def dpace_items_loop(anchors, depths, inclusion, ce, valid, alpha: float) -> list[float]:
    """D-PACE weight of each item, written out: the chain of anchor a is its drawn items by depth; w_j = pi_j
    sum_{m>=j valid} C_m / pi_m with C_m the product of q~ = (1 - alpha) exp(-CE) + alpha over its valid slots."""
    chains: dict[int, dict[int, int]] = {}
    for i, (a, d) in enumerate(zip(anchors.tolist(), depths.tolist(), strict=True)):
        chains.setdefault(a, {})[d] = i
    out = [0.0] * len(anchors)
    for slots in chains.values():
        c, prod = {}, 1.0
        for d in sorted(slots):
            i = slots[d]
            if valid[i]:
                prod *= (1 - alpha) * math.exp(-float(ce[i])) + alpha
                c[d] = prod
        for d, i in slots.items():
            if valid[i]:
                out[i] = float(inclusion[i]) * sum(c[m] / float(inclusion[slots[m]]) for m in c if m >= d)
    return out


@pytest.mark.parametrize(("ratio", "seed"), [(1.0, 0), (0.7, 1), (0.7, 2)])
def test_item_dpace_weights_equal_the_chains_written_out(ratio, seed):
    """Padded rows of COD items, some slots untrained mid-chain, against the loop."""
    g = torch.Generator().manual_seed(seed)
    rows = [cod_sample(_trained(S, seed + S), 5, ratio, 0.2, g) for S in (30, 22)]
    N = max(a.numel() for a, *_ in rows)
    batch = {
        "items_anchor": torch.zeros(2, N, dtype=torch.long),
        "items_depth": torch.zeros(2, N, dtype=torch.long),
        "items_valid": torch.zeros(2, N, dtype=torch.bool),
        "items_inclusion": torch.ones(2, N),
    }
    for b, (a, d, pi) in enumerate(rows):
        n = a.numel()
        batch["items_anchor"][b, :n], batch["items_depth"][b, :n] = a, d
        batch["items_valid"][b, :n], batch["items_inclusion"][b, :n] = True, pi
    # ratio 1 keeps all but a chain or two (n_d = M - d); 0.7 thins the deep items
    assert (
        float(batch["items_inclusion"].min()) > 0.9
        if ratio == 1.0
        else float(batch["items_inclusion"].min()) < 0.5
    )
    ce = torch.rand(2, N, generator=g) * 3
    valid = batch["items_valid"] & (torch.rand(2, N, generator=g) > 0.15)  # some untrained slots mid-chain
    got = item_dpace_weights(ce, valid, batch, 5, 0.6)
    for b, (a, d, pi) in enumerate(rows):
        n = a.numel()
        want = dpace_items_loop(a, d, pi, ce[b, :n], valid[b, :n], 0.6)
        torch.testing.assert_close(got[b, :n], torch.tensor(want), rtol=1e-5, atol=1e-6)
        assert float(got[b, n:].abs().sum()) == 0.0  # padding weighs nothing


def test_cod_inclusion_makes_dpace_unbiased():
    """Monte Carlo over 600 COD draws of one sequence: the mean estimated weight of each drawn slot, averaged over
    the slots of a depth, is the weight of the whole chains (ratio 1 +- 0.01); without the inclusion (chances of
    1) the ratio is 0.75 at depth 1 and 0.92 at depth 5."""
    from draftsmith.models.objectives import dpace_weights

    S, D = 40, 6
    trained = torch.ones(S, dtype=torch.bool)
    trained[-1] = False
    ce = torch.rand(S, D, generator=torch.Generator().manual_seed(0)) * 2
    whole = torch.tensor([[a + d <= S - 2 for d in range(D)] for a in range(S)])
    full = dpace_weights(ce, whole, 0.5)
    total, count = torch.zeros(S, D), torch.zeros(S, D)
    for seed in range(600):
        a, d, pi = cod_sample(trained, D, 0.8, 0.2, torch.Generator().manual_seed(seed))
        drawn, chance = torch.zeros(S, D, dtype=torch.bool), torch.ones(S, D)
        drawn[a, d], chance[a, d] = True, pi
        total += dpace_weights(ce, drawn, 0.5, chance) * drawn
        count += drawn
    for depth in range(D):
        seen = whole[:, depth] & (count[:, depth] > 30)
        ratio = float((total[seen, depth] / count[seen, depth] / full[seen, depth]).mean())
        assert abs(ratio - 1) < 0.01, (depth, ratio)


def test_dpace_terms_equal_the_items_weighted_loss(tiny_random_target):
    """`objective: {loss: ce, weighting: dpace}`: each depth's sum is sum_items w * CE(draft, target argmax), with
    the items' CE from whole logits and w from the chains written out (the method computes both in chunks)."""
    from draftsmith.models.objectives import ObjectiveConfig

    target = tiny_random_target
    cfg = PEagleConfig(
        feature_layers=[1, 2, 3],
        num_layers=2,
        num_depths=4,
        mask_token_id=0,
        mask_embedding="frozen",
        cod_ratio=0.6,
        cod_min_ratio=0.1,
    )
    torch.manual_seed(0)
    draft = PEagleDraft(cfg, target.model.config, target.vocab_size)
    _randomize(draft, 2)
    draft.attach_target(target.embed_tokens, target.head)
    objective = ObjectiveConfig(loss="ce", weighting="dpace", dpace_alpha=0.4)
    method = PEagleMethod(target, draft, seed=0, loss_chunk=8, objective=objective)
    ids = torch.randint(0, target.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    batch["attention_mask"][1, 18:] = 0
    batch["loss_mask"][1, 18:] = 0
    prepared = method.prepare_batch(draft, batch, step=5, micro_batch=0, rank=0)
    sums, _ = method.loss_terms(draft, prepared)
    with torch.no_grad():
        feats, _ = target.batch_features(prepared, (1, 2, 3, "final"))
        g = torch.cat([feats[i] for i in (1, 2, 3)], dim=-1)
        hidden = draft(g, ids, prepared["items_anchor"], prepared["items_depth"], prepared["items_valid"])
        weights, columns = item_targets(prepared)
        labels = target.head(feats["final"][torch.arange(2)[:, None], columns]).argmax(-1)
        ce = torch.nn.functional.cross_entropy(draft.logits(hidden).transpose(1, 2), labels, reduction="none")
    want = torch.zeros(4, dtype=torch.float64)
    for b in range(2):
        keep = prepared["items_valid"][b]
        a, d, pi = (prepared[k][b][keep] for k in ("items_anchor", "items_depth", "items_inclusion"))
        w = dpace_items_loop(a, d, pi, ce[b][keep], weights[b][keep], 0.4)
        for i in range(int(keep.sum())):
            want[int(d[i])] += w[i] * float(ce[b][keep][i])
    torch.testing.assert_close(sums.double(), want, rtol=1e-4, atol=1e-4)
    assert float(prepared["items_inclusion"].min()) < 1.0  # COD thinned the deep items


# ---- the mask token -------------------------------------------------------------------------------------


class _Tokenizer(types.SimpleNamespace):
    def __len__(self) -> int:
        return 100


def test_mask_token_choice():
    """Explicit id, else the tokenizer's mask token, else the first unused row, else pad / eos / unk; only an
    ordinary token (the last resort, or an explicit id below len(tokenizer)) is not dedicated."""
    plain = {"mask_token_id": None, "pad_token_id": 3, "eos_token_id": 2, "unk_token_id": None}
    assert pick_mask_token(_Tokenizer(**{**plain, "mask_token_id": 7}), 100) == (7, True)
    assert pick_mask_token(_Tokenizer(**plain), 128) == (100, True)  # the first unused embedding row
    assert pick_mask_token(_Tokenizer(**plain), 100) == (3, False)  # no spare row: pad, an ordinary token
    assert pick_mask_token(_Tokenizer(**{**plain, "pad_token_id": None}), 100) == (2, False)
    assert pick_mask_token(_Tokenizer(**plain), 128, explicit=110) == (110, True)
    assert pick_mask_token(_Tokenizer(**plain), 128, explicit=9) == (9, False)
    with pytest.raises(ValueError, match="not a row"):
        pick_mask_token(_Tokenizer(**plain), 100, explicit=110)
    with pytest.raises(ValueError, match="set draft.mask_token_id"):
        pick_mask_token(_Tokenizer(**{**plain, "pad_token_id": None, "eos_token_id": None}), 100)


# ---- end to end ------------------------------------------------------------------------------------------


def test_draftsmith_train_peagle_runs_and_decodes_losslessly(tiny_toy_target, tmp_path):
    """Three steps through `draftsmith train peagle` on the tiny toy target: every depth's term and tau_estimate
    are logged, final/ loads as a peagle drafter through the evaluator, and its chain decodes exactly as greedy
    decoding (the T=0 self-check on more prompts is tests/unit/eval/test_decoder.py)."""
    import subprocess

    from _run import REPO, env

    from draftsmith.eval.decoder import SpeculativeDecoder, plain_decode
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.sampling import Sampling
    from draftsmith.models.checkpoint import read_drafter_config
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train.core.metrics import read_metrics

    out = tmp_path / "run"
    cmd = [
        "draftsmith",
        "train",
        "peagle",
        "--config",
        str(REPO / "recipes" / "peagle" / "tiny.yaml"),
        f"target.path={tiny_toy_target}",
        f"output_dir={out}",
        "train.max_steps=3",
        "checkpoint.every=0",
        "data.max_samples=24",
        "data.eval_max_samples=4",
        "data.max_len=96",
    ]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert len(records) == 3 and all(math.isfinite(r["train/loss"]) for r in records)
    assert all(f"train/depth{d}/loss" in records[0] for d in (1, 2, 3))
    assert all(r["train/tokens"] > 0 and r["train/tau_estimate"] >= 1.0 for r in records)
    config = read_drafter_config(out / "final")
    assert config["kind"] == "peagle" and config["drafter"]["mask_token_id"] is not None
    assert config["drafter"]["mask_embedding"] in ("learned", "frozen")
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    drafter = load_drafter_spec(str(out / "final"), target)  # through the family record, as `draftsmith eval`
    assert isinstance(drafter, PEagleDrafter)
    prompt = target.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    spec = SpeculativeDecoder(target, drafter, parse_tree("chain", 3), Sampling()).generate(prompt, 12)
    assert spec.tokens == plain_decode(target, prompt, 12, Sampling()).tokens


def test_depth_loss_takes_the_recipes_objective():
    """`objective.loss=tv`: each depth's sum is its items' 1 - alpha (alpha over the draft vocabulary, logged
    beside it); `loss: null` is EAGLE-3's soft cross-entropy, unchanged."""
    from draftsmith.models.objectives import ObjectiveConfig
    from draftsmith.train.peagle import depth_loss

    g = torch.Generator().manual_seed(3)
    draft, target = torch.randn(2, 5, 6, generator=g), torch.randn(2, 5, 6, generator=g)
    weights = torch.rand(2, 5, generator=g) > 0.2
    depths = torch.randint(0, 3, (2, 5), generator=g)
    t2d = torch.ones(6, dtype=torch.bool)
    tv, counts, m = depth_loss(draft, target, weights, depths, t2d, 3, ObjectiveConfig(loss="tv"))
    torch.testing.assert_close(tv, counts - m["alpha"])
    classic, _, _ = depth_loss(draft, target, weights, depths, t2d, 3, None)
    soft = -(target.softmax(-1) * draft.log_softmax(-1)).sum(-1)
    expected = torch.stack([(soft * weights * (depths == d)).sum() for d in range(3)])
    torch.testing.assert_close(classic, expected)
