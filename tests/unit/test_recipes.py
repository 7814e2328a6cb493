"""Every YAML under recipes/ (recursively) parses into its method's config tree."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from draftsmith.train.core.config import load_config
from draftsmith.train.distill import DistillRecipe
from draftsmith.train.eagle import EagleRecipe
from draftsmith.train.medusa import MedusaRecipe
from draftsmith.train.mtp import MTPRecipe

REPO = Path(__file__).resolve().parents[2]
RECIPE_CLASSES = {"medusa": MedusaRecipe, "eagle": EagleRecipe, "distill": DistillRecipe, "mtp": MTPRecipe}
# Update when adding a recipe: a glob that silently finds fewer files than exist must fail.
EXPECTED_RECIPES = 10


def test_every_recipe_parses():
    found = sorted((REPO / "recipes").rglob("*.yaml"))
    assert len(found) == EXPECTED_RECIPES, [str(p) for p in found]
    for path in found:
        method = path.relative_to(REPO / "recipes").parts[0]
        assert method in RECIPE_CLASSES, f"{path}: no config class for recipes/{method}/"
        cfg = load_config(RECIPE_CLASSES[method], path, ["target.path=some/target"])
        assert cfg.target.path == "some/target"


def test_recipes_ship_as_package_data():
    packaged = files("draftsmith.recipes")
    for path in (REPO / "recipes").rglob("*.yaml"):
        rel = path.relative_to(REPO / "recipes")
        assert packaged.joinpath(*rel.parts).read_text() == path.read_text()
