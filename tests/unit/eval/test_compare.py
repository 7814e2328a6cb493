"""`draftsmith compare`: the paired difference in tau against a hand-computed case, the report's own standard
error (an invariant), a simulation of many prompt sets, refusals, and real reports of the tiny target."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from draftsmith.eval.acceptance import main as eval_main
from draftsmith.eval.compare import main, pair
from draftsmith.eval.report import tau_stderr
from draftsmith.runtime.errors import UserError

SETTINGS = {"data": "d.jsonl", "temperature": 0.0, "top_p": 1.0, "tree": "chain", "depth": 3, "seed": 0}


def report(answers: Sequence[tuple[str, int, float, int]], **settings) -> dict:
    """A report of answers `(prompt id, turn, tokens committed by verification, verification steps)`."""
    rows = [
        {"id": i, "turn": t, "tau": c / n if n else None, "target_forwards": n + 1} for i, t, c, n in answers
    ]
    steps = sum(n for *_, n in answers)
    return {
        "tau": sum(c for _, _, c, _ in answers) / steps,
        "per_prompt": rows,
        "num_prompts": len({i for i, *_ in answers}),
        "settings": {**SETTINGS, **settings},
    }


def test_a_hand_computed_case():
    # The same answers (T = 0: 20, 30 and 10 tokens); A needs 10, 20, 10 steps, B 8, 15, 10.
    a = report([("p1", 0, 20, 10), ("p2", 0, 30, 20), ("p3", 0, 10, 10)])
    b = report([("p1", 0, 20, 8), ("p2", 0, 30, 15), ("p3", 0, 10, 10)])
    r = pair(a, b)
    # tau_A = 60/40 = 1.5, u_A = (5, 0, -5)/40; tau_B = 60/33, u_B = (20 - 8 tau_B, 30 - 15 tau_B, 10 - 10 tau_B)/33
    tau_b = 60 / 33
    u_a = [5 / 40, 0.0, -5 / 40]
    u_b = [(20 - 8 * tau_b) / 33, (30 - 15 * tau_b) / 33, (10 - 10 * tau_b) / 33]
    se = (3 / 2 * sum((y - x) ** 2 for x, y in zip(u_a, u_b, strict=True))) ** 0.5
    assert (r.tau_reference, r.tau_other, r.difference) == pytest.approx((1.5, tau_b, tau_b - 1.5))
    assert r.stderr == pytest.approx(se) and r.stderr == pytest.approx(0.18801, abs=1e-4)
    # 0.318 is 1.69 standard errors: three prompts cannot separate them at 2, a looser test can
    assert r.verdict == "not separated" and pair(a, b, sigmas=1.5).verdict == "ahead"
    assert pair(b, a, sigmas=1.5).verdict == "behind" and pair(b, a).stderr == pytest.approx(r.stderr)
    # for 5 % of 1.5 to be 2 of these standard errors: 3 * (2 * 0.18801 / 0.075)^2 = 75.4 -> 76 prompts
    assert r.prompts_for_margin == 76 and pair(a, a).verdict == "not separated"


def test_a_ratio_line_hand_computed():
    """--line 1.1 on the hand-computed case: the margin tau_B - 1.1 tau_A, its error from u_B - 1.1 u_A."""
    a = report([("p1", 0, 20, 10), ("p2", 0, 30, 20), ("p3", 0, 10, 10)])
    b = report([("p1", 0, 20, 8), ("p2", 0, 30, 15), ("p3", 0, 10, 10)])
    tau_b = 60 / 33
    u_a = [5 / 40, 0.0, -5 / 40]
    u_b = [(20 - 8 * tau_b) / 33, (30 - 15 * tau_b) / 33, (10 - 10 * tau_b) / 33]
    se = (3 / 2 * sum((y - 1.1 * x) ** 2 for x, y in zip(u_a, u_b, strict=True))) ** 0.5
    r = pair(a, b, line=1.1)
    assert (r.over_line, r.over_line_stderr) == pytest.approx((tau_b - 1.65, se))
    assert r.over_line == pytest.approx(0.16818, abs=1e-4) and se == pytest.approx(0.17233, abs=1e-4)
    # 0.168 is 0.98 standard errors: not separated; 3 * (2 * 0.17233 / 0.16818)^2 = 12.6 -> 13 prompts
    assert (r.line_verdict, r.prompts_for_line) == ("not separated", 13)
    # the ordinary comparison is untouched, and the line at 1 is the difference itself
    assert (r.difference, r.stderr, r.verdict) == (pair(a, b).difference, pair(a, b).stderr, "not separated")
    one = pair(a, b)
    assert (one.over_line, one.over_line_stderr) == pytest.approx((one.difference, one.stderr))


def test_a_drafter_exactly_a_ratio_ahead_sits_on_that_line():
    """B needs 5/6 of A's steps on every prompt: tau_B is exactly 1.2 tau_A and u_B = 1.2 u_A, so against the
    1.2x line the margin and its error vanish, and against 1.1x the error is 0.1 of A's own."""
    a = report([("p1", 0, 30, 12), ("p2", 0, 50, 24), ("p3", 0, 40, 36), ("p4", 0, 70, 30)])
    b = report([("p1", 0, 30, 10), ("p2", 0, 50, 20), ("p3", 0, 40, 30), ("p4", 0, 70, 25)])
    plain = report([("p1", 0, 30, 30), ("p2", 0, 50, 50), ("p3", 0, 40, 40), ("p4", 0, 70, 70)])
    on = pair(a, b, line=1.2)
    assert on.ratio == pytest.approx(1.2) and on.over_line == pytest.approx(0.0, abs=1e-12)
    assert on.over_line_stderr == pytest.approx(0.0, abs=1e-12) and on.prompts_for_line == 0
    below = pair(a, b, line=1.1)
    assert below.over_line_stderr == pytest.approx(0.1 * pair(plain, a).stderr)
    assert below.over_line == pytest.approx(0.1 * on.tau_reference) and below.line_verdict == "above"
    assert pair(a, b, line=1.3).line_verdict == "below" and pair(b, a, line=1 / 1.2).line_verdict != "above"


def test_the_line_is_a_column_of_the_table(tmp_path, capsys):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    a = report([("p1", 0, 30, 12), ("p2", 0, 50, 24), ("p3", 0, 40, 36), ("p4", 0, 70, 30)])
    b = report([("p1", 0, 30, 10), ("p2", 0, 50, 20), ("p3", 0, 40, 30), ("p4", 0, 70, 25)])
    for path, rep in zip(paths, (a, b), strict=True):
        path.write_text(json.dumps(rep))
    assert main([*map(str, paths), "--line", "1.1"]) == 0
    out = capsys.readouterr().out
    r = pair(a, b, line=1.1)
    assert "verdict at 1.1x" in out and f"| {r.over_line:+.3f} ± {r.over_line_stderr:.3f} | above |" in out
    assert main(list(map(str, paths))) == 0 and "verdict at" not in capsys.readouterr().out
    with pytest.raises(UserError, match="--line must be a ratio above 0"):
        main([*map(str, paths), "--line", "0"])


def test_against_plain_decoding_the_paired_error_is_the_reports_own():
    # B commits one token a step on every prompt (tau 1, no spread), so the difference's error is A's own.
    rng = random.Random(0)
    answers = [(f"p{j}", 0, rng.randint(30, 90), rng.randint(15, 60)) for j in range(12)]
    a = report(answers)
    plain = report([(i, t, c, int(c)) for i, t, c, _ in answers])
    own = tau_stderr(
        [
            SimpleNamespace(  # type: ignore[misc]
                step_tokens=c, steps=[None] * n
            )
            for *_, c, n in answers
        ]
    )
    assert pair(plain, a).stderr == pytest.approx(own)


def test_turns_of_a_prompt_are_one_cluster():
    two_turns = report([("p1", 0, 10, 5), ("p1", 1, 30, 10), ("p2", 0, 20, 10), ("p3", 0, 12, 12)])
    merged = report([("p1", 0, 40, 15), ("p2", 0, 20, 10), ("p3", 0, 12, 12)])
    other = report([("p1", 0, 10, 4), ("p1", 1, 30, 9), ("p2", 0, 20, 9), ("p3", 0, 12, 10)])
    other_merged = report([("p1", 0, 40, 13), ("p2", 0, 20, 9), ("p3", 0, 12, 10)])
    r, m = pair(two_turns, other), pair(merged, other_merged)
    assert (r.stderr, r.prompts, r.answers) == (pytest.approx(m.stderr), 3, 4)


def test_the_error_matches_the_spread_over_many_prompt_sets():
    """Draw 400 sets of 40 prompts whose difficulty varies far more than the two drafters differ: the paired
    standard error estimates the spread of the difference over the sets (and is far below the unpaired one)."""
    rng = random.Random(1)
    diffs, errors, unpaired = [], [], []
    for _ in range(400):
        a_rows, b_rows = [], []
        for j in range(40):
            tokens = rng.randint(40, 120)
            easy = rng.uniform(1.1, 2.6)  # the prompt's own tau: most of tau's spread
            a_rows.append((f"p{j}", 0, tokens, max(1, round(tokens / easy))))
            b_rows.append((f"p{j}", 0, tokens, max(1, round(tokens / (easy * rng.uniform(1.0, 1.1))))))
        a, b = report(a_rows), report(b_rows)
        r = pair(a, b)
        diffs.append(r.difference)
        errors.append(r.stderr)
        unpaired.append(pair(report([(i, 0, c, c) for i, _, c, _ in a_rows]), a).stderr)
    mean = sum(diffs) / len(diffs)
    spread = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
    assert sum(errors) / len(errors) == pytest.approx(spread, rel=0.15)
    assert sum(errors) / len(errors) < 0.5 * sum(unpaired) / len(unpaired)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (report([("p1", 0, 20, 10), ("p9", 0, 30, 20)]), "did not answer the same prompts"),
        (report([("p1", 0, 20, 10), ("p2", 0, 30, 20)], temperature=0.7), "not measured alike (temperature"),
        (report([("p1", 0, 20, 10), ("p2", 0, 30, 20)], data="other.jsonl"), "not measured alike (data"),
    ],
)
def test_what_cannot_be_paired_is_refused(other, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        pair(report([("p1", 0, 20, 10), ("p2", 0, 30, 20)]), other)


def _with_content(r: dict, sha256: str) -> dict:
    return {**r, "measured": {"data": {"sha256": sha256}}}


def test_the_same_file_named_two_ways_is_paired_and_other_content_is_not():
    """Reports that recorded the same data content pair whatever path named the file (relative in one run,
    absolute in another); the same name over other content is refused."""
    rows = [("p1", 0, 20, 10), ("p2", 0, 30, 20)]
    relative = _with_content(report(rows, data="copy_eval.jsonl"), "a" * 64)
    absolute = _with_content(
        report([("p1", 0, 20, 8), ("p2", 0, 30, 20)], data="/tmp/x/copy_eval.jsonl"), "a" * 64
    )
    assert pair(relative, absolute).difference == pytest.approx(50 / 28 - 50 / 30)
    with pytest.raises(UserError, match=r"not measured alike \(data sha256"):
        pair(relative, _with_content(report(rows, data="copy_eval.jsonl"), "b" * 64))
    with pytest.raises(UserError, match=r"not measured alike \(data:"):
        pair(relative, _with_content(report(rows, data="other.jsonl"), "b" * 64))
    # A folder's hash covers all its splits: two splits of one folder hash alike and are still refused.
    train = _with_content(report(rows, data="hf:/data/set:train"), "c" * 64)
    with pytest.raises(
        UserError, match=r"not measured alike \(data: 'hf:/data/set:train' vs 'hf:/data/set:test'"
    ):
        pair(train, _with_content(report(rows, data="hf:/data/set:test"), "c" * 64))


def test_tree_and_depth_may_differ_and_bad_rows_are_refused():
    a = report([("p1", 0, 20, 10), ("p2", 0, 30, 20)])
    assert pair(a, report([("p1", 0, 20, 7), ("p2", 0, 30, 11)], tree="topk:2", depth=5)).prompts == 2
    with pytest.raises(UserError, match="at least 2 prompts"):
        pair(report([("p1", 0, 20, 10)]), report([("p1", 0, 20, 9)]))
    broken = {**a, "per_prompt": [{"id": "p1", "turn": 0}, *a["per_prompt"][1:]]}
    with pytest.raises(UserError, match="per_prompt row 0 is not a measured answer"):
        pair(a, broken)
    twice = {**a, "per_prompt": [a["per_prompt"][0]] * 2}
    with pytest.raises(UserError, match="repeated"):
        pair(a, twice)


def test_real_reports_of_the_tiny_target(tiny_toy_target, tmp_path, capsys):
    """ngram and the target drafting for itself (`self`, every draft accepted) on the same built-in prompts:
    the paired taus are the reports' own, and the table ranks them."""
    paths = []
    for drafter in ("ngram", "self"):
        path = tmp_path / f"{drafter}.json"
        args = ["--target", str(tiny_toy_target), "--drafter", drafter, "--data", "prompts:heldout"]
        args += ["--num-prompts", "4", "--max-new-tokens", "24", "--depth", "2", "--no-progress"]
        assert eval_main([*args, "--report", str(path)]) == 0
        paths.append(path)
    capsys.readouterr()
    assert main([*map(str, paths), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    ngram, own = (json.loads(p.read_text()) for p in paths)
    (result,) = json.loads((tmp_path / "c.json").read_text())
    assert (result["tau_reference"], result["tau_other"]) == pytest.approx((ngram["tau"], own["tau"]))
    assert result["prompts"] == 4 and result["verdict"] == "ahead"
    assert f"| {paths[1]} | {own['tau']:.3f} | {result['difference']:+.3f} ± {result['stderr']:.3f} |" in out
    with pytest.raises(UserError, match="a reference report and at least one other"):
        main([str(paths[0])])


def test_a_file_that_is_not_a_report_is_one_line(tmp_path):
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps(report([("p1", 0, 20, 10), ("p2", 0, 30, 20)])))
    bad.write_text(json.dumps({"prompts": ["not a report"]}))
    with pytest.raises(ValueError, match="b.json is not a `draftsmith eval` report"):
        main([str(good), str(bad)])
