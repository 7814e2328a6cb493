"""bench.scaling_rivals: the rivals get exactly a scaling run's samples (a prefix of its cache) and steps, or a
one-line refusal when the data changed since the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scaling_rivals
from draftsmith.config.loader import load_config
from draftsmith.config.save import save_config
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.train.cache.build import build_cache, finish_index
from draftsmith.train.cache.store import FeatureCache
from draftsmith.train.eagle import RECIPE

REPO = Path(__file__).resolve().parents[3]
TEXTS = [f"def f{i}(x):\n    return x * {i} + {i * i}  # sample {i}\n" * (1 + i % 3) for i in range(40)]


@pytest.fixture(scope="module")
def scaling_run(tiny_toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of 40 texts (10 % held out) and a run that trained on its first 12 samples for 7 steps."""
    root = tmp_path_factory.mktemp("rivals")
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    shared = [
        f"target.path={tiny_toy_target}",
        f"data.train=[{data}]",
        "data.eval=[]",
        "data.eval_fraction=0.1",
    ]
    shared += ["data.max_len=64", f"data.cache={root / 'cache'}"]
    built = load_config(
        RECIPE, REPO / "recipes" / "eagle" / "eagle3_tiny.yaml", [*shared, "data.max_samples=null"]
    )
    planned = build_cache("eagle", built, "bf16", 400, 4, rank=0, world=1, progress=False)
    finish_index(root / "cache", root / "cache" / "settings.json", planned)
    run = root / "train" / "tokens-N"
    run.mkdir(parents=True)
    trained = load_config(
        RECIPE, REPO / "recipes" / "eagle" / "eagle3_tiny.yaml", [*shared, "data.max_samples=12"]
    )
    save_config(trained, run / "config.yaml")
    (run / "metrics.jsonl").write_text('{"step": 5, "train/loss": 3.0}\n{"step": 7, "eval/loss": 2.0}\n')
    return run


def test_the_rivals_get_the_runs_cache_prefix_and_its_steps(scaling_run: Path, tmp_path: Path) -> None:
    recipe = load_config(RECIPE, scaling_run / "config.yaml")
    model = FrozenTarget.load(TargetConfig(path=recipe.target.path, dtype="float32"))

    path, count, tokens, longest, data = scaling_rivals.export_samples(recipe, model, tmp_path)

    cached = FeatureCache.open(str(recipe.data.cache), verify=False).dataset("train").tokens_only()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert count == len(rows) == 12 < len(data.train)  # the run took the cache's first 12 train samples
    for i, row in enumerate(rows):  # the oracle: the cache's own samples, in its order
        assert row["input_ids"] == cached[i]["input_ids"].tolist()
        assert row["loss_mask"] == [int(m) for m in cached[i]["loss_mask"].tolist()]
    assert tokens == sum(len(r["input_ids"]) for r in rows) and longest == max(
        len(r["input_ids"]) for r in rows
    )
    assert scaling_rivals.run_steps(scaling_run) == 7


def test_data_changed_since_the_run_is_refused_in_one_line(scaling_run: Path, tmp_path: Path) -> None:
    recipe = load_config(RECIPE, scaling_run / "config.yaml")
    model = FrozenTarget.load(TargetConfig(path=recipe.target.path, dtype="float32"))
    data = Path(recipe.data.train[0])
    original = data.read_text()
    try:
        edited = [t.replace("x * 1 ", "x * 7 ") for t in TEXTS]  # the same token counts, other tokens
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in edited))
        with pytest.raises(SystemExit, match=f"built from other data.*{data.name}.*the rivals would not see"):
            scaling_rivals.export_samples(recipe, model, tmp_path)
    finally:
        data.write_text(original)


def test_a_family_gets_the_same_samples_from_the_runs_records(scaling_run: Path, tmp_path: Path) -> None:
    recipe = load_config(RECIPE, scaling_run / "config.yaml")
    model = FrozenTarget.load(TargetConfig(path=recipe.target.path, dtype="float32"))
    samples, count, _, _, data = scaling_rivals.export_samples(recipe, model, tmp_path)

    records, heldout = scaling_rivals.source_records(data, count, tmp_path)

    kept = [json.loads(line)["text"] for line in records.read_text().splitlines()]
    assert len(kept) == 12 and all(t in TEXTS for t in kept)
    assert heldout is not None and len(heldout.read_text().splitlines()) == len(data.eval) > 0
    assert not set(kept) & {json.loads(line)["text"] for line in heldout.read_text().splitlines()}
    scaling_rivals.check_records(records, heldout, samples, recipe, model)  # renders to the run's tokens
    records.write_text("".join(reversed(records.read_text().splitlines(keepends=True))))
    with pytest.raises(SystemExit, match="render to other samples"):
        scaling_rivals.check_records(records, heldout, samples, recipe, model)


def test_an_unknown_family_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        scaling_rivals.main(["--run", str(tmp_path), "--out", str(tmp_path), "--families", "eagle3,medusa"])
    assert exit_info.value.code == 2 and "no family eagle3" in capsys.readouterr().err
