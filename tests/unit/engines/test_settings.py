"""engine-eval's settings: the command line parsed once into typed fields, its values checked before anything
runs, each mistake in one line."""

from __future__ import annotations

import dataclasses

import pytest

from draftsmith.engines.engine_eval import build_parser
from draftsmith.engines.settings import EngineEvalArgs, parse_engine_eval_args
from draftsmith.runtime.errors import UserError

REQUIRED = ["--target", "t", "--drafter", "ngram", "--data", "d"]


def parse(*extra: str) -> EngineEvalArgs:
    return parse_engine_eval_args(build_parser(), [*REQUIRED, *extra])


def test_the_defaults_are_the_dataclass_defaults():
    assert parse() == EngineEvalArgs(target="t", drafter="ngram", data="d")
    flags = [a.dest for a in build_parser()._actions if a.dest != "help"]
    assert flags == [f.name for f in dataclasses.fields(EngineEvalArgs)]  # one flag per field, in order


def test_values_arrive_typed_and_the_level_lists_as_sorted_integers():
    args = parse(
        *("--depth", "3", "--top-p", "0.9", "--temperature", "1", "--max-rel-diff", "0.1"),
        *("--concurrency", "8,1,2,2", "--context-lengths", "512", "--enforce-eager", "--no-progress"),
        *("--depths", "5,1,3", "--max-speedup-diff", "0.2"),
    )
    assert args.depths == (1, 3, 5) and args.max_speedup_diff == 0.2
    assert args.depth == 3 and args.top_p == 0.9 and args.temperature == 1.0 and args.max_rel_diff == 0.1
    assert args.concurrency == (1, 2, 8) and args.context_lengths == (512,)
    assert args.enforce_eager is True and args.progress is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--temperature", "-1"], "--temperature and --num-prompts must be >= 0"),
        (["--target", "m.gguf"], "engine-eval serves a model directory"),
        (["--concurrency", "1,x"], r"--concurrency '1,x': expected comma-separated integers"),
        (["--context-lengths", "0"], r"--context-lengths '0': every value must be >= 1"),
        (["--plot", "p.png"], "--plot draws the curves of --concurrency or --context-lengths"),
        (
            ["--plot", "p.png", "--depths", "1,2"],
            "--plot draws the curves of --concurrency or --context-lengths",
        ),
        (["--depths", "0,2"], r"--depths '0,2': every value must be >= 1"),
        (["--max-speedup-diff", "0"], "--max-speedup-diff must be > 0"),
        (["--context-prompts", "0"], "--context-prompts must be >= 1"),
        (["--context-data", "docs.jsonl"], "--context-data holds the documents of --context-lengths"),
        # several mistakes: the first in the order the flags were always checked
        (["--context-prompts", "0", "--concurrency", "x", "--temperature", "-1"], "--temperature"),
    ],
)
def test_a_value_out_of_range_is_one_line(extra, message):
    with pytest.raises(UserError, match=message):
        parse(*extra)
