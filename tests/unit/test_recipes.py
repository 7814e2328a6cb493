"""Every YAML under recipes/ (recursively) parses into its method's config tree."""

from __future__ import annotations

import importlib
import json
from importlib.resources import files
from pathlib import Path

import pytest

from draftsmith.config.loader import load_config
from draftsmith.train.methods import TRAIN_METHODS

REPO = Path(__file__).resolve().parents[2]
RECIPE_CLASSES = {method: importlib.import_module(module).RECIPE for method, module in TRAIN_METHODS.items()}
# Update when adding a recipe: a glob that silently finds fewer files than exist must fail.
EXPECTED_RECIPES = 31
ACCELERATE = REPO / "recipes" / "accelerate"  # launch configs, not method recipes


def test_every_recipe_parses():
    found = sorted(p for p in (REPO / "recipes").rglob("*.yaml") if ACCELERATE not in p.parents)
    assert len(found) == EXPECTED_RECIPES, [str(p) for p in found]
    for path in found:
        method = path.relative_to(REPO / "recipes").parts[0]
        assert method in RECIPE_CLASSES, f"{path}: no config class for recipes/{method}/"
        cfg = load_config(RECIPE_CLASSES[method], path, ["target.path=some/target"])
        assert cfg.target.path == "some/target"


def test_accelerate_launch_configs_load_as_accelerate_reads_them():
    """Each launch config is read by accelerate's own loader into the engine its name says, and the DeepSpeed
    JSON it names exists and leaves the recipe's settings to the recipe ("auto")."""
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {
        "single": "NO",
        "ddp": "MULTI_GPU",
        "fsdp": "FSDP",
        "zero2": "DEEPSPEED",
        "zero3": "DEEPSPEED",
    }
    assert sorted(p.stem for p in ACCELERATE.glob("*.yaml")) == sorted(expected)
    for name, engine in expected.items():
        cfg = load_config_from_file(str(ACCELERATE / f"{name}.yaml"))
        assert str(cfg.distributed_type).split(".")[-1] == engine, name
        if engine == "FSDP":
            assert cfg.fsdp_config["fsdp_version"] == 2
        if engine == "DEEPSPEED":
            ds = json.loads((REPO / cfg.deepspeed_config["deepspeed_config_file"]).read_text())
            assert ds["zero_optimization"]["stage"] == int(name[-1])
            for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
                assert ds[key] == "auto", (name, key)
            if name == "zero3":  # final/ needs the gathered weights
                assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_recipes_ship_as_package_data():
    packaged = files("draftsmith.recipes")
    for path in [*(REPO / "recipes").rglob("*.yaml"), *(REPO / "recipes").rglob("*.json")]:
        rel = path.relative_to(REPO / "recipes")
        assert packaged.joinpath(*rel.parts).read_text() == path.read_text()


def test_recipe_paths_resolve_to_the_shipped_recipes_from_any_directory(tmp_path, monkeypatch):
    """`--config recipes/medusa/toy.yaml` works outside a checkout (the recipes draftsmith installs), a file of
    that name in the working directory wins, and a recipe that exists nowhere still fails naming the path."""
    from draftsmith.config.loader import ConfigError, recipe_path

    monkeypatch.chdir(tmp_path)
    shipped = recipe_path("recipes/medusa/toy.yaml")
    assert shipped == Path(str(files("draftsmith"))) / "recipes" / "medusa" / "toy.yaml" and shipped.is_file()
    cfg = load_config(RECIPE_CLASSES["medusa"], "recipes/medusa/toy.yaml", ["target.path=t"])
    assert cfg == load_config(RECIPE_CLASSES["medusa"], shipped, ["target.path=t"])
    (tmp_path / "recipes" / "medusa").mkdir(parents=True)
    (tmp_path / "recipes" / "medusa" / "toy.yaml").write_text("train:\n  lr: 0.5\n")
    assert recipe_path("recipes/medusa/toy.yaml") == Path("recipes/medusa/toy.yaml")
    assert load_config(RECIPE_CLASSES["medusa"], "recipes/medusa/toy.yaml", ["target.path=t"]).train.lr == 0.5
    with pytest.raises(ConfigError, match=r"^config file not found: recipes/medusa/nope\.yaml$"):
        load_config(RECIPE_CLASSES["medusa"], "recipes/medusa/nope.yaml")
