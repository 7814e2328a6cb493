"""Every architecture people serve drafters for, at tiny size with random weights (toy/tiny_targets.py).

Oracles: the model's own forward (`model(...).logits`, `output_hidden_states`), plain greedy decoding, the
target drafting for itself (accepted with probability 1 at any temperature), and each engine layout's
validator. The full architecture x drafter-kind matrix (train 3 steps, T=0 lossless, every serving engine's
export) runs one cell per architecture by default and the rest under `-m slow`.
"""

from __future__ import annotations

import math

import pytest
import torch

from bench import arch_matrix
from draftsmith.eval.decoder import SpeculativeDecoder, plain_decode
from draftsmith.eval.drafters import EagleDrafter, LMDrafter, MTPDrafter, NgramDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.models.mtp import MTPConfig, MTPDraft
from draftsmith.models.parts import with_cache
from draftsmith.models.target import FrozenTarget
from draftsmith.toy.tiny_targets import ARCHITECTURES, available, build_tiny_target

ARCHS = [a for a in ARCHITECTURES if available(a)]
LINEAR = ("qwen3_next", "qwen3_5")  # hybrid linear-attention targets: chains only


@pytest.fixture(scope="module")
def tokenizer():
    return arch_matrix.tokenizer()


@pytest.fixture(scope="module")
def targets(tokenizer):
    cache: dict[str, FrozenTarget] = {}

    def get(arch: str) -> FrozenTarget:
        if arch not in cache:
            cache[arch] = FrozenTarget(build_tiny_target(arch, tokenizer), tokenizer, arch)
        return cache[arch]

    return get


def test_the_matrix_covers_every_architecture_the_issue_names():
    named = {
        "llama",
        "llama_tied",
        "llama3_rope",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "gemma2",
        "gemma3",
        "phi3",
        "glm4",
        "olmo2",
        "granite",
        "smollm3",
        "deepseek_v3",
        "gpt_oss",
        "llama4",
    }
    assert named <= set(ARCHS), f"the pinned transformers lacks {named - set(ARCHS)}"


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_features_are_the_models_own(arch, targets):
    """Soft labels, T>0 verification and every drafter's inputs come from these: they must equal the model's
    own forward, Granite's logit scaling, Gemma's soft-capping and MoE routing included."""
    target = targets(arch)
    ids = torch.arange(3, 40)[None] % target.vocab_size
    own = target.model(ids, output_hidden_states=True)
    L = target.num_layers
    feats, logits = target.forward(ids, layer_ids=[*range(L), "final"], return_logits=True)
    for i in range(L):
        torch.testing.assert_close(feats[i], own.hidden_states[i], rtol=0, atol=1e-6)
    torch.testing.assert_close(feats["final"], own.hidden_states[L], rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, own.logits, rtol=0, atol=1e-5)
    # features alone: the forward ends at the deepest tap, the last layer never runs, the values are the same
    ran: list[int] = []
    handle = target.decoder.layers[L - 1].register_forward_hook(lambda *_: ran.append(1))
    try:
        taps, none = target.forward(ids, layer_ids=[L - 1, 0])
        assert none is None and not ran
        for i in (0, L - 1):
            torch.testing.assert_close(taps[i], own.hidden_states[i], rtol=0, atol=1e-6)
        target.forward(ids, layer_ids=[0, "final"])
        assert ran  # the decoder's output wanted: every layer runs
        ran.clear()
        target.sharded = True  # FSDP / ZeRO-3's hooks must see every layer's forward end
        target.forward(ids, layer_ids=[0])
        assert ran
    finally:
        target.sharded = False
        handle.remove()


def test_a_target_whose_logits_draftsmith_cannot_reproduce_is_refused(tokenizer, monkeypatch):
    """Simulate an architecture whose post-head transform draftsmith does not know (as Granite's scaling was)."""
    from draftsmith.models.target_parts import TargetHead

    monkeypatch.setattr(TargetHead, "forward", lambda self, hidden: self.lm_head(hidden))
    with pytest.raises(ValueError, match="does not reproduce"):
        FrozenTarget(build_tiny_target("granite", tokenizer), tokenizer, "granite")
    FrozenTarget(build_tiny_target("llama", tokenizer), tokenizer, "llama")  # nothing to reproduce: accepted


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "granite"])
def test_drafters_embed_with_the_plain_table_as_served(arch, targets):
    """Gemma scales embeddings by sqrt(H) (Gemma-3 inside its embedding module), Granite by a multiplier; the
    engines' drafts look tokens up in the plain table, so drafters must train on exactly that (ModelOpt's
    Gemma report: trained with the scale, served without, tau 1.004)."""
    target = targets(arch)
    ids = torch.tensor([[5, 9, 11]])
    weight = target.model.get_input_embeddings().weight
    torch.testing.assert_close(target.embed_tokens(ids), weight[ids], rtol=0, atol=0)
    scaled = target.model(ids, output_hidden_states=True).hidden_states[0]
    assert not torch.allclose(scaled, weight[ids])  # the decoder itself does scale


def _prompt(tokenizer) -> list[int]:
    return tokenizer("def area(width, height):\n    return width * height\n" * 2)["input_ids"]


def _untrained(kind: str, target: FrozenTarget):
    torch.manual_seed(0)
    if kind == "ngram":
        return NgramDrafter()
    if kind == "self":
        return LMDrafter(target.model, name="self")
    if kind == "eagle3":
        draft = Eagle3Draft(
            EagleConfig(version=3, feature_layers=[1, 2, 3]), target.model.config, target.vocab_size
        )
        draft.attach_target(target.embed_tokens, target.head)
        return EagleDrafter(draft)
    mtp = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size)
    mtp.attach_target(target.embed_tokens, target.head)
    return MTPDrafter(mtp)


@pytest.mark.parametrize("arch", ARCHS)
def test_t0_decoding_is_lossless_with_rollback_on_every_architecture(arch, targets, tokenizer):
    """Rejected drafts are rolled back in every kind of cache: sliding-window and chunked layers (the prompt
    is longer than their 8-token windows), linear-attention state (snapshot and replay), MoE and MLA."""
    target = targets(arch)
    prompt = _prompt(tokenizer)
    greedy = Sampling(temperature=0.0)
    expected = plain_decode(target, prompt, 16, greedy, stop_ids=set()).tokens
    trees = ["chain"] if arch in LINEAR else ["chain", "topk:2"]
    # self: every draft accepted; ngram: partly; an untrained EAGLE-3: rejected, so every step rolls back.
    # MTP modules are the family's own layers on DeepSeek-V3 / Qwen3-Next / Qwen3.5 (Llama-style elsewhere).
    kinds = ["self", "ngram", "eagle3"] + (["mtp"] if arch in ("llama", "deepseek_v3", *LINEAR) else [])
    for kind in kinds:
        for tree in trees:
            decoder = SpeculativeDecoder(target, _untrained(kind, target), parse_tree(tree, 2), greedy)
            decoder.stop_ids = set()
            out = decoder.generate(prompt, 16)
            assert out.tokens == expected, (kind, tree)
            if kind == "self":
                assert all(s.accepted == s.depth for s in out.steps[:-1]), (kind, tree)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_answers_with_the_growing_cache_are_generates_own(arch, targets, tokenizer):
    """`data regenerate --target` answers a left-padded batch with a cache that appends in place
    (models/growing_cache.py): the same tokens and scores as `generate` with transformers' own cache, sliding
    windows (prompts longer than 8 tokens), MLA, MoE and linear-attention layers included."""
    from draftsmith.runtime.tokens import left_pad
    from draftsmith.scripts.data.regenerate_local import answer_cache

    model = targets(arch).model
    ids, mask = left_pad([_prompt(tokenizer)[:n] for n in (20, 13, 9)], 0)
    mine = answer_cache(model, ids.shape[1] + 12)
    assert mine, f"{arch}: no growing cache"
    runs = [
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
            **cache,
        )
        for cache in ({}, mine)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    for theirs, ours in zip(runs[0].scores, runs[1].scores, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_oss", "deepseek_v3", "mixtral"])
def test_t0_decoding_is_lossless_with_an_fp8_kv_cache(arch, targets, tokenizer):
    """`--kv-cache fp8` (keys and values in float8, per-tensor scale): speculative decoding equals plain greedy
    decoding with the same cache, token for token, through rollbacks of chains and trees; sliding-window
    (Gemma-2, gpt-oss), MLA (DeepSeek-V3) and MoE targets included. The cache really is fp8: the first
    decoded step's logits differ from the full-precision cache's."""
    from draftsmith.eval.kv_cache import new_cache

    target = targets(arch)
    prompt = _prompt(tokenizer)
    greedy = Sampling(temperature=0.0)
    expected = plain_decode(target, prompt, 16, greedy, stop_ids=set(), kv_cache="fp8").tokens
    ids = torch.tensor([prompt])
    logits = {}
    for kv in ("auto", "fp8"):
        cache = new_cache(target.model.config, kv)
        with torch.no_grad():
            target.model(input_ids=ids, **with_cache(target.model, cache), use_cache=True)
            logits[kv] = target.model(input_ids=ids[:, :1], **with_cache(target.model, cache)).logits
    assert not torch.equal(logits["auto"], logits["fp8"])
    for kind in ("self", "ngram", "eagle3"):
        for tree in ("chain", "topk:2"):
            decoder = SpeculativeDecoder(
                target, _untrained(kind, target), parse_tree(tree, 2), greedy, kv_cache="fp8"
            )
            decoder.stop_ids = set()
            assert decoder.generate(prompt, 16).tokens == expected, (kind, tree)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_target_drafting_for_itself_is_always_accepted_at_t1(arch, targets, tokenizer):
    """At T=1 the target's own samples are accepted with probability 1 (min(1, p/q) = 1): only if the verifier's
    p is exactly the drafter's q, i.e. the model's own distribution (Granite accepted 4% before)."""
    target = targets(arch)
    decoder = SpeculativeDecoder(
        target, LMDrafter(target.model, name="self"), parse_tree("chain", 3), Sampling(temperature=1.0)
    )
    decoder.stop_ids = set()
    out = decoder.generate(_prompt(tokenizer), 20, torch.Generator().manual_seed(0))
    full = [s for s in out.steps if s.depth == 3]
    assert full and all(s.accepted == 3 for s in full)


def test_trees_are_refused_on_linear_attention_targets(targets):
    with pytest.raises(ValueError, match="linear-attention layers"):
        SpeculativeDecoder(
            targets("qwen3_next"), NgramDrafter(), parse_tree("topk:2", 2), Sampling(temperature=0.0)
        )


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mixtral", "deepseek_v3", "phi3"])
def test_draft_layers_are_the_engines_llama_layer_whatever_the_target(arch, targets):
    """No qkv bias, q/k norm, fused projection, MLA or expert tensor reaches an EAGLE or generic MTP draft, and
    every weight is finite (an MoE layer built outside its model used to leave experts uninitialised)."""
    target = targets(arch)
    eagle3 = _untrained("eagle3", target).draft
    names = set(eagle3.layer.state_dict())
    assert {n.rsplit(".", 1)[0] for n in names if not n.startswith("rotary_emb")} == {
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "post_attention_layernorm",
    }
    for draft in (eagle3, _untrained("mtp", target).draft):
        assert all(torch.isfinite(p).all() for p in draft.parameters())


def _cells() -> list:
    """One cell per architecture in the default run (kinds rotate so each is covered several times) plus every
    kind on Llama; the rest of the matrix is `slow`."""
    kinds = list(arch_matrix.KINDS)
    out = []
    for i, arch in enumerate(ARCHS):
        for j, kind in enumerate(kinds):
            fast = arch == "llama" or j == i % len(kinds)
            out.append(pytest.param(arch, kind, marks=() if fast else pytest.mark.slow, id=f"{arch}-{kind}"))
    return out


@pytest.mark.parametrize(("arch", "kind"), _cells())
def test_matrix_cell_trains_decodes_losslessly_and_exports(arch, kind, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "arch-matrix"
    result = arch_matrix.run_cell(arch, kind, root)
    assert result.green, result
    if result.train.startswith("refused"):
        assert "serving engine" in result.train and "vLLM" in result.train  # one line naming the engines


def test_an_unserved_pair_is_refused_before_the_first_step(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "arch-matrix"
    target = arch_matrix.target_dir("llama", root)
    with pytest.raises(
        ValueError, match=r"no serving engine loads mtp drafters for a llama target.*allow_unserved"
    ):
        arch_matrix._train("mtp", target, root / "refused")
    assert not (root / "refused" / "final").exists()


def test_a_non_finite_loss_stops_training_with_one_line_and_no_final(tmp_path_factory, monkeypatch):
    """A NaN at step 2 stops the run at step 2, naming the terms and the cause; final/ is never written."""
    root = tmp_path_factory.getbasetemp() / "arch-matrix"
    target = arch_matrix.target_dir("llama", root)
    calls = {"n": 0}
    original = FrozenTarget.batch_features

    def poisoned(self, batch, layer_ids, return_logits=False):
        feats, logits = original(self, batch, layer_ids, return_logits)
        calls["n"] += (
            torch.is_grad_enabled()
        )  # training micro-batches only (held-out evaluation runs no_grad)
        if torch.is_grad_enabled() and calls["n"] == 2:
            feats = {k: v * math.nan for k, v in feats.items()}
        return feats, logits

    monkeypatch.setattr(FrozenTarget, "batch_features", poisoned)
    from draftsmith.train.core.finite import NonFiniteLoss

    with pytest.raises(
        NonFiniteLoss, match=r"training stopped at step 2: loss term\(s\) depth1, depth2 not finite"
    ):
        arch_matrix._train("medusa", target, root / "nan")
    assert not (root / "nan" / "final").exists()


REAL_TARGET_RECIPES = {  # recipe -> the architecture it targets, built tiny (8 layers, so the default taps exist)
    "eagle/eagle3_llama3_8b.yaml": "llama3_rope",
    "eagle/eagle3_qwen3_8b.yaml": "qwen3",
    "eagle/eagle3_qwen3_30b_a3b.yaml": "qwen3_moe",
    "eagle/eagle3_gpt_oss_20b.yaml": "gpt_oss",
    "eagle/eagle3_gemma3_1b.yaml": "gemma3",
    "medusa/qwen3_8b.yaml": "qwen3",
}


@pytest.mark.parametrize("recipe", sorted(REAL_TARGET_RECIPES))
def test_real_target_recipe_runs_on_its_architecture_at_tiny_size(recipe, tokenizer, tmp_path):
    """The recipe's own settings (EAGLE-3: taps by default, draft vocabulary, TTT steps, head init; Medusa: the
    heads) on the same architecture at tiny size: finite losses and exports every serving engine validates."""
    import importlib

    from draftsmith.recipes import __file__ as recipes_init
    from draftsmith.ship.export import main as export_main
    from draftsmith.train.core.metrics import read_metrics

    path = tmp_path / "target"
    build_tiny_target(REAL_TARGET_RECIPES[recipe], tokenizer, layers=8).save_pretrained(path)
    tokenizer.save_pretrained(path)
    method = recipe.split("/")[0]
    main = importlib.import_module(f"draftsmith.train.{method}").main
    out = tmp_path / "run"
    code = main(
        [
            "--config",
            str(__import__("pathlib").Path(recipes_init).parent / recipe),
            f"target.path={path}",
            f"output_dir={out}",
            "target.dtype=float32",
            "train.mixed_precision=no",
            "log.wandb=false",
            "data.train=[stdlib:train]",
            "data.eval=[stdlib:heldout]",
            "data.max_samples=16",
            "data.eval_max_samples=2",
            "data.max_len=256",
            "train.max_steps=2",
            "checkpoint.every=0",
            "eval.every=0",
            "log.every=1",
            "train.micro_batch_size=2",
            "train.grad_accum=1",
        ]
    )
    assert code == 0
    losses = [v for r in read_metrics(out / "metrics.jsonl") for k, v in r.items() if k.endswith("/loss")]
    assert losses and all(math.isfinite(v) for v in losses)
    for engine in ("vllm", "sglang") if method == "eagle" else ("vllm", "tgi"):
        assert export_main([str(out / "final"), "--to", engine, "--out", str(tmp_path / engine)]) == 0
