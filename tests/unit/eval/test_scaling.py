"""The scaling fit: tau = a + b ln(tokens), weighted by each point's standard error, inverted for a goal tau."""

from __future__ import annotations

import json
import math

import pytest

from draftsmith.eval.scaling import Point, extrapolation, fit, predict, tokens_for


def on_line(a: float, b: float, sizes: list[float], stderr: float = 0.05) -> list[Point]:
    return [Point(n, a + b * math.log(n), stderr) for n in sizes]


SETTINGS = {"data": "mt_bench.jsonl", "num_prompts": 16, "max_new_tokens": 96, "temperature": 0.0, "depth": 5}


def report(tau: float, stderr: float, **settings: object) -> dict:
    """An evaluator report as `draftsmith data needed` reads it: tau, its standard error, how it was measured."""
    return {"tau": tau, "tau_stderr": stderr, "num_prompts": 16, "settings": {**SETTINGS, **settings}}


eval_report = report


def test_points_on_a_line_give_that_line_and_its_inverse():
    points = on_line(0.2, 0.1, [64e3, 256e3, 1e6])
    line = fit(points)
    assert line.a == pytest.approx(0.2) and line.b == pytest.approx(0.1)
    assert line.tokens_for(0.2 + 0.1 * math.log(4e6)) == pytest.approx(4e6)
    assert line.tau(1e6) == pytest.approx(0.2 + 0.1 * math.log(1e6))


def test_hand_computed_weighted_fit():
    # x = ln N = 0, 1, 2 (N = 1, e, e^2); taus 1, 2, 2 with weights 1, 1, 4 (stderr 1, 1, 0.5):
    # mean x = (0 + 1 + 8) / 6 = 1.5, mean y = (1 + 2 + 8) / 6 = 11/6,
    # sxx = 2.25 + 0.25 + 4 * 0.25 = 3.5, sxy = (-1.5)(-5/6) + (-0.5)(1/6) + 4 (0.5)(1/6) = 1.5, b = 3/7
    points = [Point(1.0, 1.0, 1.0), Point(math.e, 2.0, 1.0), Point(math.e**2, 2.0, 0.5)]
    line = fit(points)
    assert line.b == pytest.approx(3 / 7)
    assert line.a == pytest.approx(11 / 6 - 1.5 * 3 / 7)


def test_a_noisy_point_counts_less():
    points = on_line(1.0, 0.1, [1e4, 1e5, 1e6], stderr=0.01)
    outlier = [*points, Point(1e7, 5.0, 100.0)]
    assert fit(outlier).b == pytest.approx(0.1, abs=1e-3)


def test_the_bootstrap_range_holds_the_value_and_grows_with_the_noise():
    points = on_line(1.0, 0.1, [64e3, 256e3, 1e6], stderr=0.02)
    tight = tokens_for(points, 1.0 + 0.1 * math.log(2e6))
    wide = tokens_for(on_line(1.0, 0.1, [64e3, 256e3, 1e6], stderr=0.1), 1.0 + 0.1 * math.log(2e6))
    guess = predict(points, 4e6)
    for e in (tight, wide, guess):
        assert e.value is not None and e.low is not None and e.high is not None
    assert tight.no_answer == 0 and guess.no_answer == 0  # a noisier curve may have draws that do not rise
    assert tight.value == pytest.approx(2e6) and tight.low < 2e6 < tight.high  # type: ignore[operator]
    assert wide.high / wide.low > tight.high / tight.low  # type: ignore[operator]
    assert guess.value == pytest.approx(1.0 + 0.1 * math.log(4e6))
    assert guess.low < guess.value < guess.high  # type: ignore[operator]
    assert extrapolation(points, 4e6) == pytest.approx(4.0)


def test_a_flat_curve_has_no_answer():
    flat = [Point(1e4, 1.5, 0.01), Point(1e5, 1.5, 0.01), Point(1e6, 1.49, 0.01)]
    assert fit(flat).tokens_for(2.0) is None
    estimate = tokens_for(flat, 2.0)
    assert estimate.value is None and estimate.no_answer > 0.5


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="two different training sizes"):
        fit([Point(1e4, 1.2, 0.1), Point(1e4, 1.3, 0.1)])
    with pytest.raises(ValueError, match="positive"):
        fit([Point(0, 1.2, 0.1), Point(1e4, 1.3, 0.1)])


def test_data_needed_reads_reports_and_inverts_the_curve(tmp_path, capsys):
    """`draftsmith data needed`: reports on the line tau = 0.2 + 0.1 ln N give back the N of a goal tau, and the
    smaller points predict the largest."""
    from draftsmith.scripts.data.needed import main as needed_main

    args = []
    for label, n in (("64k", 64e3), ("256k", 256e3), ("1m", 1e6), ("2m", 2e6)):
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(report(0.2 + 0.1 * math.log(n), 0.01)))
        args += ["--point", f"{label}={path}"]
    goal = 0.2 + 0.1 * math.log(8e6)
    assert needed_main([*args, "--tau", f"{goal:.6f}"]) == 0
    out = capsys.readouterr().out
    assert "needs about 8,000,0" in out or "needs about 7,999,9" in out  # 8e6 up to the rounding of --tau
    assert "+0.069 per doubling" in out
    measured = 0.2 + 0.1 * math.log(2e6)
    assert f"the smaller points predict {measured:.3f}" in out


def test_data_needed_refuses_bad_points(tmp_path):
    from draftsmith.runtime.errors import UserError
    from draftsmith.scripts.data.needed import main as needed_main

    report = tmp_path / "r.json"
    report.write_text(json.dumps(eval_report(1.5, 0.1)))
    with pytest.raises(UserError, match="not a token count"):
        needed_main(["--point", f"lots={report}", "--tau", "2"])
    with pytest.raises(UserError, match="expected TOKENS=REPORT.json"):
        needed_main(["--point", str(report), "--tau", "2"])
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(UserError, match="is not a `draftsmith eval` report"):
        needed_main(["--point", f"1k={tmp_path / 'x.json'}", "--tau", "2"])
    with pytest.raises(UserError, match="the same report is given twice"):
        needed_main(["--point", f"1k={report}", "--point", f"2k={report}", "--tau", "2"])
    second = tmp_path / "r2.json"
    second.write_text(json.dumps(eval_report(1.6, 0.1)))
    with pytest.raises(UserError, match="two points have the same token count"):
        needed_main(["--point", f"1k={report}", "--point", f"1000={second}", "--tau", "2"])
    with pytest.raises(SystemExit):  # two points: a line without an uncertainty
        needed_main(["--point", f"1k={report}", "--point", f"2k={second}", "--tau", "2"])


def _curve(tmp_path, **last: object) -> list[str]:
    args = []
    for label, n in (("64k", 64e3), ("256k", 256e3), ("1m", 1e6)):
        path = tmp_path / f"{label}.json"
        path.write_text(
            json.dumps(report(1.2 + 0.05 * math.log(n / 64e3), 0.02, **(last if label == "1m" else {})))
        )
        args += ["--point", f"{label}={path}"]
    return args


@pytest.mark.parametrize(
    ("goal", "message"),
    [
        ("nan", "--tau must be a finite number above 1"),
        ("inf", "--tau must be a finite number above 1"),
        ("1", "--tau must be a finite number above 1"),
        ("0.5", "--tau must be a finite number above 1"),
        ("6", "cannot be reached at the measured depth 5"),
    ],
)
def test_data_needed_refuses_a_goal_no_curve_can_answer(tmp_path, goal, message):
    from draftsmith.runtime.errors import UserError
    from draftsmith.scripts.data.needed import main as needed_main

    with pytest.raises(UserError, match=message):
        needed_main([*_curve(tmp_path), "--tau", goal])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": "gsm8k.jsonl"}, "not measured alike \\(data: 'mt_bench.jsonl' vs 'gsm8k.jsonl'\\)"),
        ({"max_new_tokens": 128}, "not measured alike \\(max_new_tokens: 96 vs 128\\)"),
        ({"num_prompts": 8}, "not measured alike \\(num_prompts: 16 vs 8\\)"),
        ({"drafter": "ngram"}, "which was trained on no tokens"),
    ],
)
def test_data_needed_refuses_points_of_different_curves(tmp_path, change, message):
    from draftsmith.runtime.errors import UserError
    from draftsmith.scripts.data.needed import main as needed_main

    with pytest.raises(UserError, match=message):
        needed_main([*_curve(tmp_path, **change), "--tau", "1.5"])


def test_data_needed_says_when_the_answer_is_far_beyond_the_data(tmp_path, capsys):
    """tau = 1.2 + 0.05 ln(N / 64k) reaches 2.0 at 64k e^16: about 5.7e11 tokens, 568,711x the largest point."""
    from draftsmith.scripts.data.needed import main as needed_main

    assert needed_main([*_curve(tmp_path), "--tau", "2.0"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "far beyond the data: 568,711x the largest measured point" in line  # 64e3 e^16 / 1e6
    assert needed_main([*_curve(tmp_path), "--tau", "1.3"]) == 0  # 64k e^2 = 473k: inside the data
    assert "far beyond" not in capsys.readouterr().out
