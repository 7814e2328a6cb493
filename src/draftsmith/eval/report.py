"""The acceptance report: metrics of ALGORITHMS.md 9.6 from the decoding loop's step records.

tau                 tokens committed per verification forward, bonus/correction token included, prefill
                    excluded, POOLED over the answers: sum(step tokens) / sum(steps) (vanilla decoding = 1.00);
                    what vLLM and SGLang print (their mean acceptance length)
tau_per_request     the MEAN over answers of each answer's own tau (what SpecForge's benchmarks print): long
                    answers weigh as much as short ones, so two drafters can rank differently under the two
by_category         tau (pooled and per request) and answers per data `category` (e.g. MT-bench's eight)
by_span             steps, tokens and tau on tool-call spans and on prose, on reasoning and on the answer
                    (eval/spans.py: a step belongs to the span of the first token it commits)
by_context          steps, tau and alpha per context-length bucket (the tokens before a step: prompt and answer
                    so far; buckets end at 512, 1k, 2k, ... 256k tokens), over the steps in the bucket
alpha               accepted draft tokens / draft tokens sent for verification (every tree node counts)
acceptance_by_depth P(a draft token at depth d is accepted | the path was accepted to depth d-1), over the
                    steps whose tree reached depth d
draft_cost_s        seconds of one draft step: the steps' drafting time over the depths they drafted (a chain
                    drafter runs one draft step per depth); the depth prediction's c_draft (eval/depth.py)
tau_stderr          standard error of tau over the answers (delta method for the ratio estimator, each
                    answer one cluster of steps): the noise of tau from the choice of prompts
target_forwards     prefill + verification forwards of the target
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.runtime.display import fmt_value, pyplot, table
from draftsmith.runtime.errors import UserError

from .decoder import Generation, Step
from .depth import verdict
from .spans import by_span


@dataclass
class TurnResult:
    """One generated answer (one turn of one item) with its plain-decoding baseline."""

    item: str
    turn: int
    prompt_tokens: int
    spec: Generation
    baseline: Generation | None = None
    prompt: list[int] | None = None  # the prompt's token ids (engine-eval sends the same ids to the engine)
    category: str | None = None  # the record's `category`, if any
    spans: dict[str, list[bool]] | None = (
        None  # per answer token: in a tool call, in reasoning (eval/spans.py)
    )
    has_tools: bool = False  # the data offered tools to this turn


def acceptance_by_depth(generations: Sequence[Generation]) -> list[float | None]:
    depth = max((s.depth for g in generations for s in g.steps), default=0)
    rates: list[float | None] = []
    for d in range(1, depth + 1):
        reached = [s for g in generations for s in g.steps if s.depth >= d and s.accepted >= d - 1]
        rates.append(sum(s.accepted >= d for s in reached) / len(reached) if reached else None)
    return rates


def tau_stderr(generations: Sequence[Generation]) -> float | None:
    """Standard error of tau = sum c_i / sum n_i (c_i tokens over n_i steps of answer i), delta method:
    sqrt(k / (k - 1) * sum (c_i - tau n_i)^2) / sum n_i. None with fewer than 2 answers."""
    pairs = [(g.step_tokens, len(g.steps)) for g in generations]
    k, steps = len(pairs), sum(n for _, n in pairs)
    if k < 2 or steps == 0:
        return None
    tau = sum(c for c, _ in pairs) / steps
    return (k / (k - 1) * sum((c - tau * n) ** 2 for c, n in pairs)) ** 0.5 / steps


def _rate(num: float, den: float) -> float | None:
    return num / den if den else None


def draft_cost_per_depth(steps: Sequence[Step]) -> float | None:
    """Seconds per drafted depth: all drafting time over the depths the steps drafted (`Step.depth`, the tree's
    depth, not its token count; depths shrink near the budget and an n-gram step may draft none, and such a
    step's drafting time still counts). None when no step drafted anything."""
    return _rate(sum(s.draft_s for s in steps), sum(s.depth for s in steps))


def tau_per_request(generations: Sequence[Generation]) -> float | None:
    """The mean over answers of each answer's tau (answers without a verification step skipped)."""
    taus = [g.step_tokens / len(g.steps) for g in generations if g.steps]
    return sum(taus) / len(taus) if taus else None


CONTEXT_BUCKETS = tuple(
    512 * 2**k for k in range(10)
)  # 512 .. 262,144 tokens: the largest vocabularies' models


def by_context(generations: Sequence[Generation]) -> list[dict[str, Any]]:
    """`[{"context", "steps", "tau", "alpha"}]` per context-length bucket with steps, shortest first; a step's
    context is the tokens before it (its KV cache plus the last committed token)."""
    groups: dict[int, list[Any]] = {}
    for g in generations:
        for step in g.steps:
            context = step.cache_len + 1
            k = next((i for i, b in enumerate(CONTEXT_BUCKETS) if context <= b), len(CONTEXT_BUCKETS))
            groups.setdefault(k, []).append(step)
    rows = []
    for k in sorted(groups):
        steps = groups[k]
        if k == len(CONTEXT_BUCKETS):
            name = f">{CONTEXT_BUCKETS[-1]}"
        else:
            name = f"{CONTEXT_BUCKETS[k - 1] + 1 if k else 1}-{CONTEXT_BUCKETS[k]}"
        rows.append(
            {
                "context": name,
                "steps": len(steps),
                "tau": _rate(sum(s.committed for s in steps), len(steps)),
                "alpha": _rate(sum(s.accepted for s in steps), sum(s.draft_tokens for s in steps)),
            }
        )
    return rows


def by_category(turns: Sequence[TurnResult]) -> dict[str, dict[str, Any]]:
    """`{category: {"answers", "tau", "tau_per_request"}}` for the turns that carry a category, sorted by name."""
    groups: dict[str, list[TurnResult]] = {}
    for t in turns:
        if t.category is not None:
            groups.setdefault(t.category, []).append(t)
    out = {}
    for name in sorted(groups):
        gens = [t.spec for t in groups[name]]
        steps = sum(len(g.steps) for g in gens)
        out[name] = {
            "answers": len(gens),
            "tau": _rate(sum(g.step_tokens for g in gens), steps),
            "tau_per_request": tau_per_request(gens),
        }
    return out


def summarize(turns: Sequence[TurnResult]) -> dict[str, Any]:
    """The report's metrics over `turns` (the `settings` and `per_prompt` keys are added by the caller)."""
    gens = [t.spec for t in turns]
    steps = [s for g in gens for s in g.steps]
    new_tokens = sum(len(g.tokens) for g in gens)
    wall = sum(g.wall_s for g in gens)
    have_baseline = bool(turns) and all(t.baseline is not None for t in turns)
    base_tokens = sum(len(t.baseline.tokens) for t in turns if t.baseline is not None)
    base_wall = sum(t.baseline.wall_s for t in turns if t.baseline is not None)
    tokens_per_s = _rate(new_tokens, wall)
    baseline_tps = _rate(base_tokens, base_wall) if have_baseline else None
    draft_s = sum(s.draft_s for s in steps)
    verify_s = sum(s.verify_s for s in steps)
    return {
        "tau": _rate(sum(s.committed for s in steps), len(steps)),
        "tau_stderr": tau_stderr(gens),
        "tau_per_request": tau_per_request(gens),
        "by_category": by_category(turns),
        "by_context": by_context(gens),
        "by_span": by_span(turns),
        "alpha": _rate(sum(s.accepted for s in steps), sum(s.draft_tokens for s in steps)),
        "acceptance_by_depth": acceptance_by_depth(gens),
        "target_forwards": len(gens) + len(steps),
        "verification_forwards": len(steps),
        "new_tokens": new_tokens,
        "wall_time_s": wall,
        "tokens_per_s": tokens_per_s,
        "baseline_tokens_per_s": baseline_tps,
        "speedup": _rate(tokens_per_s or 0.0, baseline_tps) if baseline_tps and tokens_per_s else None,
        "draft_time_s": draft_s,
        "verify_time_s": verify_s,
        "draft_cost_s": draft_cost_per_depth(steps),
    }


def per_prompt_rows(turns: Sequence[TurnResult]) -> list[dict[str, Any]]:
    rows = []
    for t in turns:
        row = {"id": t.item, "turn": t.turn, "prompt_tokens": t.prompt_tokens, "stop": t.spec.stop}
        row.update(
            {k: summarize([t])[k] for k in ("tau", "alpha", "new_tokens", "target_forwards", "wall_time_s")}
        )
        if t.baseline is not None:
            row["baseline_tokens"] = len(t.baseline.tokens)
            row["baseline_wall_time_s"] = t.baseline.wall_s
        rows.append(row)
    return rows


def markdown(report: dict[str, Any]) -> str:
    """A Markdown summary table of `report` (printed on stdout by the CLI)."""
    s = report["settings"]
    rows = [
        ("drafter", s["drafter"]),
        ("tree / depth", f"{s['tree']} / {s['depth']}"),
        ("temperature / top-p / top-k", f"{s['temperature']} / {s['top_p']} / {s['top_k']}"),
        ("prompts (turns)", f"{report['num_prompts']} ({report['num_turns']})"),
        ("tau (tokens per verification forward, pooled: vLLM's and SGLang's)", fmt_value(report["tau"])),
        ("tau standard error (over answers)", fmt_value(report["tau_stderr"])),
        ("tau, mean per answer (SpecForge's)", fmt_value(report.get("tau_per_request"))),
        ("alpha (accepted / drafted)", fmt_value(report["alpha"])),
        ("acceptance by depth", " ".join(fmt_value(a, 2) for a in report["acceptance_by_depth"]) or "-"),
        ("target forwards (prefill + verify)", report["target_forwards"]),
        ("new tokens", report["new_tokens"]),
        ("tokens/s (speculative)", fmt_value(report["tokens_per_s"], 1)),
        ("tokens/s (plain decoding)", fmt_value(report["baseline_tokens_per_s"], 1)),
        ("speedup", fmt_value(report["speedup"], 2)),
        (
            "expected speedup by depth (measured costs)",
            " ".join(fmt_value(x, 2) for x in report.get("expected_speedup_by_depth") or []) or "-",
        ),
        ("recommended depth (whose costs)", verdict(report)),
        ("lossless (T=0 check)", fmt_value(report["lossless"])),
    ]
    drift = report.get("adapter_drift")
    if drift:  # Medusa-2: the served target is the adapted one
        rows.append(("Medusa-2 drift: KL(original || adapted) per token", fmt_value(drift["mean_kl"], 5)))
        rows.append(
            ("Medusa-2 drift: greedy answers changed", f"{drift['greedy_changed']} of {drift['prompts']}")
        )
    lines = table(["metric", "value"], rows)
    categories = report.get("by_category") or {}
    if categories:
        header = ["category", "answers", "tau (pooled)", "tau (mean per answer)"]
        cells = [
            (n, c["answers"], fmt_value(c["tau"]), fmt_value(c["tau_per_request"]))
            for n, c in categories.items()
        ]
        lines += ["", *table(header, cells)]
    spans = report.get("by_span") or {}
    if spans:
        cells = [
            (n.replace("_", " "), c["steps"], c["tokens"], fmt_value(c["tau"])) for n, c in spans.items()
        ]
        lines += ["", *table(["span", "steps", "tokens", "tau"], cells)]
    contexts = report.get("by_context") or []
    if len(contexts) > 1:  # one bucket says no more than the table above
        cells = [(c["context"], c["steps"], fmt_value(c["tau"]), fmt_value(c["alpha"])) for c in contexts]
        lines += ["", *table(["context tokens", "steps", "tau", "alpha"], cells)]
    return "\n".join(lines)


def check_report_path(path: Path, flag: str = "--report") -> None:
    """Refuse, before any measurement, to write a report over a file that is not one (a user's file named by
    mistake would be lost); an earlier report is replaced."""
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = None
    if not (isinstance(old, dict) and "tau" in old and "settings" in old):
        raise UserError(
            f"{flag} {path} exists and is not a draftsmith report; writing the report there would lose it: "
            "choose another file, or remove it yourself"
        )


def plot_panels(report: dict[str, Any]) -> list[tuple[str, list[str], list[float], str]]:
    """The plot's panels: (title, bar labels, values, y label): acceptance by depth, then tau by category, by
    context length and by span where the report has them (more than one bar)."""
    depth = [a if a is not None else 0.0 for a in report["acceptance_by_depth"]]
    panels = [
        (
            "acceptance by depth",
            [str(d) for d in range(1, len(depth) + 1)],
            depth,
            "P(accept d | accepted d-1)",
        )
    ]
    for title, rows in (
        ("tau by category", [(n, c["tau"]) for n, c in (report.get("by_category") or {}).items()]),
        ("tau by context tokens", [(c["context"], c["tau"]) for c in report.get("by_context") or []]),
        ("tau by span", [(n.replace("_", " "), c["tau"]) for n, c in (report.get("by_span") or {}).items()]),
    ):
        if len(rows) > 1:
            panels.append((title, [n for n, _ in rows], [t or 0.0 for _, t in rows], "tau (pooled)"))
    return panels


def plot_acceptance(report: dict[str, Any], out: Path) -> None:
    """A PNG of the report's panels (`plot_panels`; needs matplotlib: `pip install draftsmith[plot]`)."""
    plt = pyplot()
    panels = plot_panels(report)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), dpi=120, squeeze=False)
    for ax, (title, labels, values, ylabel) in zip(axes[0], panels, strict=True):
        ax.bar(range(len(values)), values, color="#4C72B0")
        ax.set_xticks(range(len(values)), labels, rotation=30 if len(labels) > 4 else 0, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if title == "acceptance by depth":
            ax.set_ylim(0, 1)
            ax.set_xlabel("draft depth d")
    s = report["settings"]
    fig.suptitle(
        f"{Path(s['drafter']).name} {s['tree']} T={s['temperature']}: tau {fmt_value(report['tau'], 2)}"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
