"""The quickstart's serving verdict: the draft depth to serve the trained drafter with, and whose costs say so.

draftsmith's evaluator recommends a depth from the run's acceptance and the costs of its own loop (Python,
transformers forwards, one draft step at a time): a serving engine drafts and verifies at other costs, so the
loop's "off" is not the engine's. Where vLLM is set up (`draftsmith engine-setup vllm`), the quickstart measures
the drafter in vLLM itself on the same held-out prompts at depths 1..3 (`draftsmith engine-eval --depths`, report
in the run directory), and the depth vLLM served fastest is the verdict; where it is not, the verdict line says
that the depth rests on the evaluator's costs and how to measure vLLM's.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.engines.depth_check import measured_off_reason
from draftsmith.engines.engine_eval import build_parser, measure
from draftsmith.engines.run_files import check_outputs
from draftsmith.engines.settings import parse_engine_eval_args
from draftsmith.engines.setup import engine_spec, find_env
from draftsmith.runtime.files import write_json
from draftsmith.ship.serve_depth import recommendation

SERVING_CHOICES = ("auto", "vllm", "evaluator")
DEPTHS = "1,2,3"
ENGINE_REPORT = "engine-eval.json"  # in the run directory, beside final/


def vllm_ready() -> bool:
    """Whether vLLM's venv is set up (`draftsmith engine-setup vllm`)."""
    return find_env(engine_spec("vllm")) is not None


def serving_verdict(
    choice: str, target: Path, drafter: Path, data: str, prompts: int, tokens: int, progress: bool
) -> str:
    """The verdict line: measured in vLLM (`choice` vllm, or auto where it is set up), else the evaluator's."""
    if choice == "evaluator" or (choice == "auto" and not vllm_ready()):
        why = "--serving-depth evaluator" if choice == "evaluator" else "vLLM is not set up here"
        return (
            f"serving depth: not measured in an engine ({why}); the table's depth rests on the costs of "
            "draftsmith's evaluator loop, which drafts one token at a time in Python, and a serving engine's "
            "differ. Measure vLLM's: `draftsmith engine-setup vllm`, then rerun the quickstart (it resumes)"
        )
    report_path = drafter.parent / ENGINE_REPORT
    argv = ["--engine", "vllm", "--target", str(target), "--drafter", str(drafter), "--data", data]
    argv += ["--num-prompts", str(prompts), "--max-new-tokens", str(tokens), "--depths", DEPTHS]
    argv += ["--report", str(report_path)] + ([] if progress else ["--no-progress"])
    args = parse_engine_eval_args(build_parser(), argv)
    check_outputs(args)
    print(f"      vLLM: the drafter served at depths {DEPTHS} on the same prompts (engine-eval --depths)")
    report = measure(args)
    write_json(report_path, report)
    return vllm_line(report, report_path)


def vllm_line(report: dict, path: Path) -> str:
    """The verdict from an `engine-eval --depths` report: the depth vLLM served fastest, or off."""
    measured = recommendation(report)
    engine = f"{report['engine']['package']} {report['engine']['version']}"
    speedups = measured.get("expected_speedup_by_depth") or []
    shown = ", ".join(f"{k}: {s:.2f}x" for k, s in enumerate(speedups, 1) if s)
    lossless = (
        "" if report.get("lossless") is not False else "; NOT LOSSLESS: vLLM's answers differ from plain"
    )
    if measured.get("recommended_depth"):
        head = f"{measured['recommended_depth']} ({measured['recommended_speedup']:.2f}x plain decoding)"
    else:
        head = f"off: no depth beat plain decoding; {measured_off_reason(report['depth_check'])}"
    return f"serving depth, measured in {engine}: {head}; by depth {shown}{lossless} (report: {path})"
