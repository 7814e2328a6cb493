"""bench.scaling's command line: sizes, the sets to evaluate and the recipe overrides every size trains with."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scaling


def test_sizes_read_k_and_m_as_powers_of_two_and_all_as_the_whole_cache() -> None:
    assert [scaling.parse_size(s) for s in ("64k", "2m", "1500", "all")] == [65_536, 2_097_152, 1_500, None]


def test_an_unknown_set_is_refused_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        scaling.main(["--target", "t", "--mix", "m", "--cache", "c", "--sets", "mt_bench,mmlu"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no set mmlu" in err and "mt_bench, gsm8k, humaneval" in err


def test_each_size_trains_with_the_rule_and_the_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def fake_run(cmd: list[str], log: Path) -> None:  # a training run makes its output_dir
        commands.append(list(cmd))
        Path(next(a for a in cmd if a.startswith("output_dir=")).split("=", 1)[1]).mkdir(parents=True)

    monkeypatch.setattr(scaling, "run", fake_run)
    argv = ["--target", "T", "--mix", "mix.jsonl", "--cache", "C", "--out", str(tmp_path)]
    args = scaling.build_parser().parse_args([*argv, "--set", "data.max_len=768", "--set", "train.lr=3e-4"])

    final = scaling.train(args, samples=300, tokens=64 * 1024)

    assert final == tmp_path / "train" / "tokens-65536" / "final"
    (cmd,) = commands
    assert "data.max_samples=300" in cmd
    assert "train.epochs=4.0" in cmd  # 256k / 64k, at most 4
    assert cmd[-3:] == ["data.max_len=768", "train.lr=3e-4", "--resume"]
    final.mkdir(parents=True)
    scaling.train(args, samples=300, tokens=64 * 1024)
    assert len(commands) == 1  # a trained size is kept


def test_the_rule_reads_its_floor_and_ceiling_from_the_command_line() -> None:
    argv = ["--target", "T", "--mix", "m", "--cache", "C"]
    default = scaling.build_parser().parse_args(argv)
    assert [scaling.epochs_for(default, n * 1024) for n in (32, 128, 512)] == [4.0, 2.0, 1.0]
    longer = scaling.build_parser().parse_args([*argv, "--min-seen", "1m", "--max-epochs", "10"])
    # 1,048,576 tokens seen: 10 epochs at most for 90k, 1,048,576 / 368,640 for 360k, one epoch from 1m
    assert scaling.epochs_for(longer, 90 * 1024) == 10.0
    assert scaling.epochs_for(longer, 360 * 1024) == pytest.approx(1024 / 360)
    assert scaling.epochs_for(longer, 2 * 1024 * 1024) == 1.0
    bad = scaling.build_parser().parse_args([*argv, "--min-seen", "all"])
    with pytest.raises(SystemExit, match="--min-seen 'all'"):
        scaling.epochs_for(bad, 1000)


def test_the_table_names_a_shallower_depth_and_finds_an_extras_wall_time(tmp_path: Path) -> None:
    import json

    report = {
        "tau": 1.5,
        "tau_stderr": 0.02,
        "recommended_depth": 2,
        "recommended_speedup": 1.2,
        "lossless": True,
    }
    (tmp_path / "eval").mkdir()
    for name, depth in (("tokens-1000", 5), ("mtp", 2), ("peer", 5), ("ngram", 5)):
        (tmp_path / "eval" / f"gsm8k-{name}.json").write_text(
            json.dumps({**report, "settings": {"depth": depth}})
        )
    (tmp_path / "mtp" / "final").mkdir(parents=True)
    (tmp_path / "mtp" / "wall_s.txt").write_text("61.0\n")  # a draftsmith run: its run directory
    (tmp_path / "peer-converted").mkdir()
    (tmp_path / "peer-converted" / "wall_s.txt").write_text("122.4\n")  # a converted peer: beside it
    argv = ["--target", "T", "--mix", "m", "--cache", "C", "--out", str(tmp_path), "--sets", "gsm8k"]
    argv += [
        "--drafter",
        f"mtp={tmp_path / 'mtp' / 'final'}@1000",
        "--drafter",
        f"peer={tmp_path}/peer-converted@1000",
    ]
    args = scaling.build_parser().parse_args(argv)

    rows = {line.split(" | ")[0]: line for line in scaling.table(args, [(10, 1000)]).splitlines()}

    assert "| 1.500 ± 0.020 (depth 2) | 2 (1.20x) |" in rows["| mtp"] and "| 61 s |" in rows["| mtp"]
    assert "| 1.500 ± 0.020 | 2 (1.20x) |" in rows["| peer"] and "| 122 s |" in rows["| peer"]
    assert "(depth" not in rows["| tokens-1000"]
