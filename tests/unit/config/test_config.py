"""Tests for draftsmith.config.loader: merge order, strict conversion, messages, round trip, CLI."""

# Postponed annotations on purpose: the loader must resolve string annotations with get_type_hints.
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

from draftsmith.config.cli import config_help, make_parser, parse_args
from draftsmith.config.loader import ConfigError, load_config, override_config
from draftsmith.config.save import config_to_dict, save_config


@dataclass
class OptimConfig:
    lr: float = field(default=1e-3, metadata={"help": "Peak learning rate."})
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 0
    total_steps: int = 100
    schedule: Literal["cosine", "linear", "constant"] = "cosine"

    def __post_init__(self) -> None:
        if self.warmup_steps > self.total_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds total_steps ({self.total_steps})")


@dataclass
class DatasetSpec:
    path: Path
    weight: float = 1.0


@dataclass
class DataConfig:
    sources: list[DatasetSpec] = field(default_factory=list, metadata={"help": "Datasets to mix."})
    splits: dict[str, DatasetSpec] = field(default_factory=dict)
    max_len: int = 2048
    cache_dir: Path | None = None
    layer_ids: tuple[int, ...] = (2, 16, 29)
    shuffle: bool = True


@dataclass
class HeadConfig:
    num_heads: int = 4
    extra: Any = None


@dataclass
class Recipe:
    output_dir: Path = field(metadata={"help": "Where checkpoints go."})
    seed: int = 0
    name: str = "run"
    note: Optional[str] = None  # noqa: UP045 - the typing.Optional spelling must work too
    optim: OptimConfig = field(default_factory=OptimConfig)
    # A factory whose values differ from OptimConfig's class defaults.
    finetune: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5, schedule="constant"))
    data: DataConfig = field(default_factory=DataConfig)
    head: HeadConfig | None = None


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(*overrides: str, path: Path | None = None) -> Recipe:
    return load_config(Recipe, path, ["output_dir=out", *overrides])


def error_of(*overrides: str, path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(*overrides, path=path)
    return str(info.value)


# --------------------------------------------------------------------------- merge order


def test_defaults_then_yaml_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "output_dir: ckpt\nseed: 1\noptim:\n  lr: 0.01\n  total_steps: 50\ndata:\n  max_len: 512\n",
    )
    cfg = load_config(Recipe, path, ["optim.lr=0.02", "data.shuffle=false", "seed=7", "seed=8"])
    assert cfg.output_dir == Path("ckpt")  # file only
    assert cfg.seed == 8  # the later of two overrides
    assert cfg.optim.lr == 0.02  # override beats file
    assert cfg.optim.total_steps == 50  # file beats default
    assert cfg.optim.warmup_steps == 0  # default
    assert cfg.data.max_len == 512 and cfg.data.shuffle is False
    assert cfg.name == "run" and cfg.head is None


def test_override_creates_sections_missing_from_yaml(tmp_path: Path) -> None:
    cfg = load_config(
        Recipe, write(tmp_path, "output_dir: o\n"), ["head.num_heads=8", "finetune.total_steps=20"]
    )
    assert cfg.head == HeadConfig(num_heads=8, extra=None)
    # A partial section keeps the values of the parent's default_factory, not the class defaults.
    assert cfg.finetune == OptimConfig(lr=5e-5, total_steps=20, schedule="constant")


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(Recipe, write(tmp_path, ""), ["output_dir=o"]) == Recipe(output_dir=Path("o"))


def test_yaml_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    text = "output_dir: o\noptim: &base\n  lr: 0.1\n  total_steps: 9\nfinetune:\n  <<: *base\n  lr: 0.2\n"
    cfg = load_config(Recipe, write(tmp_path, text))
    assert (cfg.optim.lr, cfg.finetune.lr, cfg.finetune.total_steps) == (0.1, 0.2, 9)


# --------------------------------------------------------------------------- scalar types


def test_pyyaml_reads_exponent_without_dot_as_string() -> None:
    # The premise of the float rule below: YAML 1.1 needs a dot for a float.
    assert yaml.safe_load("3e-4") == "3e-4"


def test_float_fields_accept_exponents_and_ints(tmp_path: Path) -> None:
    cfg = load_config(Recipe, write(tmp_path, "output_dir: o\noptim:\n  lr: 3e-4\n  betas: [0.9, 1e-2]\n"))
    assert cfg.optim.lr == pytest.approx(0.0003) and cfg.optim.betas == (0.9, 0.01)
    assert load("optim.lr=1e-3").optim.lr == pytest.approx(0.001)
    assert load("optim.lr=-2.5E+1").optim.lr == -25.0
    cfg = load("optim.lr=1")
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float


def test_float_rejects_words_with_dotted_key_and_value() -> None:
    msg = error_of("optim.lr=fast")
    assert msg.startswith("optim.lr: expected float, got 'fast' (str)")
    assert "override 'optim.lr=fast'" in msg


def test_bool_accepts_only_real_booleans(tmp_path: Path) -> None:
    assert load("data.shuffle=false").data.shuffle is False
    assert load("data.shuffle=True").data.shuffle is True
    assert error_of("data.shuffle=0").startswith("data.shuffle: expected bool, got 0 (int)")
    msg = error_of(path=write(tmp_path, "output_dir: o\ndata:\n  shuffle: 'true'\n"))
    assert msg.startswith("data.shuffle: expected bool, got 'true' (str)")
    assert f"file {tmp_path / 'recipe.yaml'}" in msg


def test_int_rejects_floats_and_bools() -> None:
    assert load("seed=12").seed == 12
    assert error_of("seed=1.5").startswith("seed: expected int, got 1.5 (float)")
    assert error_of("seed=true").startswith("seed: expected int, got True (bool)")


def test_str_field_keeps_override_text_as_typed() -> None:
    assert load("name=1234").name == "1234"
    assert load("name=1.10").name == "1.10"  # not "1.1": the text, not the parsed float
    assert load("name=").name == ""
    assert error_of("name=null").startswith("name: expected str, got None (NoneType)")


def test_literal_lists_allowed_values_and_suggests() -> None:
    assert load("optim.schedule=linear").optim.schedule == "linear"
    msg = error_of("optim.schedule=cosin")
    assert msg.startswith("optim.schedule: expected one of 'cosine', 'linear', 'constant', got 'cosin' (str)")
    assert msg.endswith("did you mean 'cosine'?")


def test_optional_fields() -> None:
    assert load("note=null").note is None
    assert load("note=hello").note == "hello"
    assert load("note=").note == ""  # an empty value is the empty string, not None
    assert load("head=null").head is None
    assert load("data.cache_dir=/tmp/cache").data.cache_dir == Path("/tmp/cache")
    assert error_of("note=[1]").startswith("note: expected str, got [1] (list)")


def test_path_fields() -> None:
    cfg = load("output_dir=runs/a")
    assert cfg.output_dir == Path("runs/a") and isinstance(cfg.output_dir, Path)
    assert error_of("output_dir=").startswith("output_dir: expected a non-empty path (Path), got ''")


def test_any_field_takes_plain_values() -> None:
    assert load("head.extra={a: [1, 2]}").head == HeadConfig(extra={"a": [1, 2]})
    extra = load("head.extra=5").head.extra  # type: ignore[union-attr]
    assert extra == 5 and type(extra) is int


# --------------------------------------------------------------------------- containers


def test_list_tuple_dict_of_nested_sections(tmp_path: Path) -> None:
    text = """
output_dir: o
data:
  sources: [{path: a.jsonl, weight: 2}, {path: b.jsonl}]
  splits:
    train: {path: t.jsonl}
    val: {path: v.jsonl, weight: 0.5}
  layer_ids: [1, 5]
"""
    cfg = load_config(Recipe, write(tmp_path, text))
    assert cfg.data.sources == [DatasetSpec(Path("a.jsonl"), 2.0), DatasetSpec(Path("b.jsonl"), 1.0)]
    assert cfg.data.splits == {
        "train": DatasetSpec(Path("t.jsonl")),
        "val": DatasetSpec(Path("v.jsonl"), 0.5),
    }
    assert cfg.data.layer_ids == (1, 5) and isinstance(cfg.data.layer_ids, tuple)


def test_container_errors_name_the_element() -> None:
    msg = error_of("data.sources=[{path: a}, {path: b, weight: heavy}]")
    assert msg.startswith("data.sources[1].weight: expected float, got 'heavy' (str)")
    msg = error_of("data.sources=[{pth: a}]")
    assert msg.startswith("unknown key 'data.sources[0].pth'")
    assert msg.endswith("did you mean 'data.sources[0].path'?")
    assert error_of("data.sources=[{weight: 1}]").startswith(
        "missing required key 'data.sources[0].path' (Path)"
    )
    msg = error_of("data.splits.val.path=v", "data.splits.val.weight=x")
    assert msg.startswith("data.splits.val.weight: expected float, got 'x' (str)")
    assert error_of("data.splits={1: {path: a}}").startswith("data.splits (key 1): expected str, got 1 (int)")
    assert error_of("data.layer_ids=[1, two]").startswith("data.layer_ids[1]: expected int, got 'two' (str)")
    assert error_of("optim.betas=[0.9]").startswith("optim.betas: expected 2 items (tuple[float, float])")
    assert error_of("data.sources=a.jsonl").startswith("data.sources: expected a list (list[DatasetSpec])")


# --------------------------------------------------------------------------- key errors


def test_unknown_key_from_file_names_file_valid_keys_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "output_dir: o\noptim:\n  lrr: 0.1\n")
    msg = error_of(path=path)
    assert msg == (
        f"unknown key 'optim.lrr' (from file {path}); valid keys in section 'optim': "
        "betas, lr, schedule, total_steps, warmup_steps; did you mean 'optim.lr'?"
    )


def test_unknown_key_from_override_names_the_override() -> None:
    msg = error_of("seeed=3")
    assert msg.startswith("unknown key 'seeed' (from override 'seeed=3'); valid keys in the top level: ")
    assert msg.endswith("did you mean 'seed'?")
    msg = error_of("head.heads=2")  # the section is created by the override itself
    assert msg.startswith("unknown key 'head.heads' (from override 'head.heads=2')")
    assert "did you mean 'head.num_heads'?" in msg


def test_unknown_key_without_near_miss_has_no_suggestion() -> None:
    assert "did you mean" not in error_of("zzzzzz=1")


def test_missing_required_field_names_key_type_and_help() -> None:
    with pytest.raises(
        ConfigError, match=r"^missing required key 'output_dir' \(Path\): Where checkpoints go\.$"
    ):
        load_config(Recipe)


def test_post_init_error_is_prefixed_with_section_path() -> None:
    assert error_of("optim.warmup_steps=200") == "optim: warmup_steps (200) exceeds total_steps (100)"
    assert error_of("finetune.total_steps=-1").startswith("finetune: warmup_steps (0) exceeds")


def test_section_given_a_scalar_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "output_dir: o\noptim: 3\n")
    assert error_of(path=path).startswith("optim: expected a mapping for section OptimConfig, got 3 (int)")


def test_override_into_a_scalar_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "output_dir: o\nseed: 3\n")
    msg = error_of("seed.x=1", path=path)
    assert msg == "override 'seed.x=1': 'seed' is 3 (int), not a section, so it has no key 'x'"
    assert error_of("seed.x=1").startswith("seed: expected int, got {'x': 1} (dict)")


@pytest.mark.parametrize("bad", ["optim.lr", "optim..lr=1", "=1", ".lr=1"])
def test_malformed_override_shows_expected_form(bad: str) -> None:
    assert "expected KEY=VALUE" in error_of(bad)


def test_bad_yaml_files(tmp_path: Path) -> None:
    path = write(tmp_path, "- a\n- b\n")
    assert error_of(path=path) == f"{path}: a config file must be a YAML mapping of keys to values, got list"
    assert error_of(path=tmp_path / "nope.yaml") == f"config file not found: {tmp_path / 'nope.yaml'}"
    path = write(tmp_path, "seed: 1\noptim:\n  lr: 0.1\n  lr: 0.2\n", "dup.yaml")
    msg = error_of(path=path)
    assert msg.startswith(f"{path}: invalid YAML") and "duplicate key 'lr'" in msg and "line 4" in msg
    path = write(tmp_path, "seed: [1\n", "broken.yaml")
    msg = error_of(path=path)
    assert msg.startswith(f"{path}: invalid YAML") and "\n" not in msg


def test_programming_errors_are_type_errors() -> None:
    with pytest.raises(TypeError, match="dataclass"):
        load_config(dict)
    with pytest.raises(TypeError, match="sequence of KEY=VALUE"):
        load_config(Recipe, None, "seed=1")


def test_runtime_annotations_without_future_import() -> None:
    # Dataclasses built with real type objects (no string annotations) convert the same way.
    plain = make_dataclass(
        "Plain", [("lr", float, field(default=0.1)), ("tags", list[str] | None, field(default=None))]
    )
    cfg: Any = load_config(plain, None, ["lr=3e-4", "tags=[a, b]"])
    assert (cfg.lr, cfg.tags) == (pytest.approx(3e-4), ["a", "b"])
    with pytest.raises(ConfigError, match=r"^tags\[1\]: expected str, got 2 \(int\)"):
        load_config(plain, None, ["tags=[a, 2]"])


# --------------------------------------------------------------------------- saving and overriding


def full_config() -> Recipe:
    return load(
        "note=hi",
        "data.sources=[{path: a.jsonl, weight: 2}]",
        "data.splits={val: {path: v.jsonl}}",
        "data.cache_dir=/tmp/c",
        "head.extra={k: [1, 2]}",
        "optim.lr=3e-4",
        "optim.betas=[0.8, 0.9]",
    )


def test_config_to_dict_is_plain() -> None:
    d = config_to_dict(full_config())
    assert d["output_dir"] == "out" and d["data"]["cache_dir"] == "/tmp/c"
    assert d["optim"] == {
        "lr": 0.0003,
        "betas": [0.8, 0.9],
        "warmup_steps": 0,
        "total_steps": 100,
        "schedule": "cosine",
    }
    assert d["data"]["sources"] == [{"path": "a.jsonl", "weight": 2.0}]
    assert d["data"]["splits"] == {"val": {"path": "v.jsonl", "weight": 1.0}}
    assert d["data"]["layer_ids"] == [2, 16, 29]
    assert d["head"] == {"num_heads": 4, "extra": {"k": [1, 2]}}
    assert list(d) == ["output_dir", "seed", "name", "note", "optim", "finetune", "data", "head"]


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    cfg = full_config()
    target = tmp_path / "ckpt" / "step_10" / "config.yaml"  # parents do not exist yet
    save_config(cfg, target)
    assert load_config(Recipe, target) == cfg
    assert sorted(p.name for p in target.parent.iterdir()) == ["config.yaml"]  # no temporary left behind
    assert "lr: 0.0003\n" in target.read_text()
    save_config(load_config(Recipe, target, ["seed=5"]), target)  # overwrite in place
    assert load_config(Recipe, target).seed == 5


def test_override_config_returns_a_new_strict_copy() -> None:
    cfg = full_config()
    new = override_config(cfg, ["optim.lr=0.1", "data.splits.train.path=t.jsonl"])
    assert new.optim.lr == 0.1 and cfg.optim.lr == pytest.approx(3e-4)
    # A dotted override adds one dict entry and keeps the others.
    assert new.data.splits == {"val": DatasetSpec(Path("v.jsonl")), "train": DatasetSpec(Path("t.jsonl"))}
    assert new.data.sources is not cfg.data.sources and new.data.sources == cfg.data.sources
    with pytest.raises(ConfigError, match=r"^unknown key 'optim\.lrr' \(from override 'optim\.lrr=1'\)"):
        override_config(cfg, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"^optim: warmup_steps \(500\) exceeds total_steps \(100\)$"):
        override_config(cfg, ["optim.warmup_steps=500"])


# --------------------------------------------------------------------------- help and command line


def test_config_help_lists_every_nested_key() -> None:
    lines = config_help(Recipe).splitlines()
    assert lines[:4] == [
        "  output_dir (Path, required): Where checkpoints go.",
        "  seed (int, default 0)",
        "  name (str, default 'run')",
        "  note (str | None, default None)",
    ]
    assert "  optim.lr (float, default 0.001): Peak learning rate." in lines
    assert "  optim.schedule ('cosine' | 'linear' | 'constant', default 'cosine')" in lines
    assert "  optim.betas (tuple[float, float], default [0.9, 0.95])" in lines
    assert "  finetune.lr (float, default 5e-05): Peak learning rate." in lines  # the factory's value
    assert "  data.sources (list[DatasetSpec], default []): Datasets to mix." in lines
    assert "  data.layer_ids (tuple[int, ...], default [2, 16, 29])" in lines
    assert "  head (HeadConfig | None, default None)" in lines
    assert "  head.num_heads (int, default 4)" in lines
    assert len(lines) == 4 + 5 + 5 + 6 + 3  # top-level scalars, optim, finetune, data, head (+2 keys)


def make_cli() -> argparse.ArgumentParser:
    parser = make_parser(Recipe, prog="train-x", description="Train a thing.")
    parser.add_argument("--resume", default=None)
    return parser


def test_parse_args_merges_file_overrides_and_extra_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "output_dir: o\nseed: 1\n")
    argv = ["seed=2", "--config", str(path), "optim.lr=0.5", "--resume", "ckpt/7", "name=x"]
    cfg, args = parse_args(Recipe, make_cli(), argv)
    assert (cfg.seed, cfg.optim.lr, cfg.name, cfg.output_dir) == (2, 0.5, "x", Path("o"))
    assert args.resume == "ckpt/7" and args.overrides == ["seed=2", "optim.lr=0.5", "name=x"]


def test_parse_args_bad_key_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(Recipe, make_cli(), ["output_dir=o", "optim.lrr=1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.rstrip().endswith(error_lines[0])
    assert error_lines[0].startswith("train-x: error: unknown key 'optim.lrr' (from override 'optim.lrr=1')")
    assert error_lines[0].endswith("did you mean 'optim.lr'?")


def test_parse_args_multiline_yaml_error_becomes_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "seed: [1\nname: x\n")
    with pytest.raises(SystemExit) as info:
        parse_args(Recipe, make_cli(), ["--config", str(path)])
    assert info.value.code == 2
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert last.startswith(f"train-x: error: {path}: invalid YAML")


def test_help_epilog_lists_config_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(Recipe, make_cli(), ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--config FILE" in out and "KEY=VALUE" in out
    assert "\n  optim.lr (float, default 0.001): Peak learning rate.\n" in out  # not re-wrapped


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.max_steps=0", r"train.max_steps must be >= 1 \(or null"),
        ("train.lr=0", "train.lr must be > 0"),
        ("train.lr=-1e-4", "train.lr must be > 0"),
        ("train.epochs=0", "train.epochs must be > 0"),
        ("train.min_lr_ratio=2", r"train.min_lr_ratio must be in \[0, 1\]"),
        ("train.max_grad_norm=0", "train.max_grad_norm must be > 0"),
    ],
)
def test_training_numbers_out_of_range_are_refused_with_the_range(override, message):
    """`train.max_steps=0` used to train a full epoch; a zero or negative lr trained nothing or diverged."""
    from draftsmith.train.medusa import MedusaRecipe

    with pytest.raises(ValueError, match=message):
        load_config(MedusaRecipe, None, ["target.path=t", override])


def test_resume_followed_by_an_override_resumes_the_latest_checkpoint(tmp_path):
    """`--resume train.lr=1e-4` used to take the override as the checkpoint path."""
    from draftsmith.train.core.entry import resume_before_overrides

    assert resume_before_overrides(["--config", "r.yaml", "--resume", "train.lr=1e-4"]) == [
        "--config",
        "r.yaml",
        "--resume=latest",
        "train.lr=1e-4",
    ]
    ckpt = tmp_path / "checkpoint-4"
    assert resume_before_overrides(["--resume", str(ckpt), "a=b"]) == ["--resume", str(ckpt), "a=b"]
    assert resume_before_overrides(["--resume"]) == ["--resume"]


def test_the_old_drafter_section_name_is_refused_with_a_pointer(tmp_path):
    from draftsmith.train.medusa import MedusaRecipe
    from draftsmith.train.mtp import MTPRecipe

    old = tmp_path / "old.yaml"
    old.write_text("target:\n  path: t\nmodel:\n  num_heads: 2\n")
    with pytest.raises(ConfigError, match=r"recipe section 'model' is now 'draft' \(from .*old.yaml\)"):
        load_config(MedusaRecipe, old)
    with pytest.raises(ConfigError, match=r"'model.KEY=...' overrides to 'draft.KEY=...'"):
        load_config(MTPRecipe, None, ["target.path=t", "model.num_modules=1"])
    assert load_config(MTPRecipe, None, ["target.path=t", "draft.num_modules=1"]).draft.num_modules == 1
