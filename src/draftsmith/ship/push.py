"""Push a drafter to the Hugging Face Hub with a model card that states what was measured.

    draftsmith push CKPT --repo ORG/NAME [--private] [--revision BRANCH] [--eval FILE ...] [--dry-run DIR]

The uploaded folder is:
- the draftsmith checkpoint at the root (what `draftsmith eval --drafter ORG/NAME` loads), with `eval.json`;
- `engines/<engine>/`: the drafter exported for each engine that serves its kind, every export validated
  against the target first (`draftsmith export`); a distilled draft LM is itself the transformers directory
  engines load, so its root is what they serve;
- `engine-eval.json` (then `engine-eval-1.json`, ...) with --engine-report: vLLM's own measurement
  (`draftsmith engine-eval --report`, one per data set), which the card states and whose `--depths` checks set
  the vLLM export's depth (over several sets, the geometric mean's fastest: `engine-eval-depths.json`);
- README.md: the model card (YAML metadata: base_model, library_name, tags, license; the tau table and
  per-depth acceptance from the acceptance reports; the recipe and data; copy-paste vLLM / SGLang commands).

A drafter without an acceptance report is refused (`draftsmith eval ... --save-eval` writes one) unless
--allow-unmeasured. `--dry-run DIR` writes exactly the folder that would be uploaded and uploads nothing.
The token comes from the usual place (HF_TOKEN, or `hf auth login`'s cache) and is never printed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.models.claims import check_baseline, check_engine_of_checkpoint, check_of_checkpoint
from draftsmith.models.families import family
from draftsmith.models.serving import serving_engines
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import atomic_dir, write_json, write_text

from .export import export, read_source
from .layouts.target_info import TargetInfo
from .model_card import HUB_ID, render_card
from .reports import read_reports, report_files
from .serve_depth import combined_depths

ENGINE_FOLDER = "engines"


def check_repo_id(repo: str, flag: str) -> None:
    """Refuse a repository id the Hub would refuse (huggingface_hub's own rule: no '--' or '..', no leading or
    trailing '-' or '.', at most 96 characters), before anything is written."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not HUB_ID.match(repo):
        raise ValueError(f"{flag} {repo!r}: expected ORG/NAME (letters, digits, '-', '_', '.')")
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise ValueError(
            f"{flag} {repo!r}: not a valid Hub repository id ({' '.join(str(err).split())[:160]})"
        ) from None


def hub_target(source: dict[str, Any], target: str | None, target_repo: str | None) -> str:
    """The Hub id the upload names the target by: `--target-repo`, else the checkpoint's (or --target's) target
    when that is a Hub id. A target known only as a local directory needs --target-repo: the card and configs
    must not publish a local path."""
    if target_repo is not None:
        check_repo_id(target_repo, "--target-repo")
        return target_repo
    for name in (target, source["target_name"]):
        if name and HUB_ID.match(name) and not Path(name).expanduser().exists():
            return name
    raise ValueError(
        f"the target is the local directory {target or source['target_name']}: pass --target-repo ORG/NAME (its "
        "Hub id) so that the card, configs and serving commands name it instead of a local path"
    )


_ABS_PATH = re.compile(r"(?<![\w.:/])(?:~|/)(?:[\w.+@-]+/)*[\w.+@-]+")


def scrub_local_paths(folder: Path, known: dict[str, str]) -> None:
    """Rewrite every JSON, YAML and Markdown file under `folder`: each `known` local path becomes its public
    name (the target's directory -> its Hub id) and any other absolute path its last component (data files,
    output directories, checkpoints), so nothing under a home or temporary directory is published."""
    order = sorted(known, key=len, reverse=True)

    def clean(text: str) -> str:
        for local in order:
            text = text.replace(local, known[local])
        return _ABS_PATH.sub(lambda m: Path(m.group(0)).name, text)

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return clean(obj)
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        return obj

    for path in folder.rglob("*"):
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            cleaned = walk(data)
            if cleaned != data:  # files without local paths (a tokenizer's) stay byte for byte as written
                write_json(path, cleaned, ensure_ascii=False)
        elif path.suffix in (".md", ".yaml", ".yml"):
            text = path.read_text()
            if clean(text) != text:
                write_text(path, clean(text))


def stage(
    ckpt: str | Path,
    folder: Path,
    repo: str,
    reports: list[Path] | None = None,
    license_id: str = "other",
    allow_unmeasured: bool = False,
    target: str | None = None,
    target_repo: str | None = None,
    engine_reports: Sequence[Path] = (),
    baseline_reports: Sequence[Path] = (),
) -> dict[str, Any]:
    """Write the folder that `push` uploads into `folder` (must not exist or be empty); returns a summary.
    The target is named by its Hub id everywhere in it (`hub_target`), and no absolute local path remains.
    Every report is checked first (`check_claims`); the folder is written whole or not at all, so a failure
    leaves it as it was. `engine_reports` (`engine-eval` reports, one per data set) travel as engine-eval.json,
    engine-eval-1.json, ..., get the card's vLLM section and, with `--depths`, set the vLLM export's depth: the
    one vLLM measured fastest, over several sets the one with the highest geometric-mean speedup
    (engine-eval-depths.json). `baseline_reports` (ngram's, measured alike) are cited beside the drafter's by
    name, as baselines."""
    src = Path(ckpt).expanduser()
    source = read_source(src)
    public_target = hub_target(source, target, target_repo)
    files = _report_files(src, reports, allow_unmeasured)
    loaded, engines, baselines = check_claims(source, files, engine_reports, baseline_reports)
    combined = combined_depths(engines)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} is not an empty directory; --dry-run needs a new or empty directory")
    with atomic_dir(folder) as tmp:
        _copy_checkpoint(src, tmp)
        if len(loaded) > 1 or files[:1] != [src / "eval.json"]:
            for i, report in enumerate(loaded):  # the reports the card cites travel with it
                write_json(tmp / ("eval.json" if i == 0 else f"eval-{i}.json"), report)
        for i, report in enumerate(baselines):
            write_json(tmp / f"baseline-eval{'' if i == 0 else f'-{i}'}.json", report)
        for i, engine in enumerate(engines):
            write_json(tmp / ("engine-eval.json" if i == 0 else f"engine-eval-{i}.json"), engine)
        depth_report = next(
            (tmp / _engine_name(i) for i, e in enumerate(engines) if "depth_check" in e), None
        )
        if combined is not None:
            depth_report = tmp / "engine-eval-depths.json"
            write_json(depth_report, combined)
        exports = _export_engines(src, source, tmp, target, depth_report or (files[0] if files else None))
        card_source = {**source, "target": {**source["target"], "name_or_path": public_target}}
        card = render_card(repo, card_source, loaded, exports, license_id, engines, baselines)
        write_text(tmp / "README.md", card)
        scrub_local_paths(tmp, _public_names(target or source["target_name"], public_target))
    return {"folder": str(folder), "engines": list(exports), "reports": len(loaded), "target": public_target}


def _engine_name(i: int) -> str:
    return "engine-eval.json" if i == 0 else f"engine-eval-{i}.json"


def check_claims(
    source: dict[str, Any],
    files: Sequence[Path],
    engine_reports: Sequence[Path],
    baseline_reports: Sequence[Path],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The drafter's reports, vLLM's and the baselines', each checked before anything is written
    (models/claims.py): every --eval and --engine-report measured this checkpoint's weights on its target; every
    --baseline-eval measured a baseline on the same target, prompts and settings as one of the drafter's."""
    ckpt, target = source["dir"], source["target"]
    loaded = read_reports(files, "--eval")
    for path, report in zip(files, loaded, strict=True):
        check_of_checkpoint(report, f"--eval {path}", ckpt, target)
    engines = read_reports(engine_reports, "--engine-report")
    for path, engine in zip(engine_reports, engines, strict=True):
        check_engine_of_checkpoint(engine, f"--engine-report {path}", ckpt, source["kind"], target)
    baselines = read_reports(baseline_reports, "--baseline-eval")
    for path, report in zip(baseline_reports, baselines, strict=True):
        check_baseline(report, f"--baseline-eval {path}", target, loaded)
    return loaded, engines, baselines


def _report_files(src: Path, reports: list[Path] | None, allow_unmeasured: bool) -> list[Path]:
    """The acceptance reports the card cites: those given, else the checkpoint's eval.json (none only when
    allowed)."""
    files = report_files(src, reports)
    if not files and not allow_unmeasured:
        raise ValueError(
            f"{src} has no eval.json: measure the drafter first (`draftsmith eval --target ... --drafter {src} "
            "--data HELDOUT --save-eval`), pass --eval REPORT.json, or push anyway with --allow-unmeasured"
        )
    return files


def _copy_checkpoint(src: Path, folder: Path) -> None:
    """The checkpoint itself (a Medusa-2 adapter/ included), without an old card, exports or leftovers."""
    for item in src.iterdir():
        if item.name in ("README.md", ENGINE_FOLDER) or item.name.endswith((".tmp", ".old")):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, folder / item.name)


def _export_engines(
    src: Path, source: dict[str, Any], folder: Path, target: str | None, report: Path | None
) -> dict[str, dict[str, Any]]:
    """Export the drafter for every engine that serves its kind for this target and draft layer (its record's
    serving limits), under `engines/<engine>/`, vLLM's at the depth `report` (the card's first) recommends;
    returns what the card says of each export."""
    target_config = TargetInfo(target or source["target_name"], source["target"].get("revision")).config
    engines = list(
        serving_engines(
            source["kind"], target_config, source["config"].get("drafter", {}).get("layer", "llama")
        )
    )
    as_is = family(source["kind"]).ships_as_is  # the root is the directory engines load (a draft LM's)
    exports: dict[str, dict[str, Any]] = {}
    for engine in engines:
        if as_is:
            with tempfile.TemporaryDirectory() as tmp:
                _, _, built = export(src, engine, Path(tmp) / "x", target, report=report)
            where = ""
        else:
            out, _, built = export(src, engine, folder / ENGINE_FOLDER / engine, target, report=report)
            (out / "eval.json").unlink(missing_ok=True)  # one copy, at the root
            where = f"{ENGINE_FOLDER}/{engine}"
        exports[engine] = {
            "folder": where,
            "layout": built.layout,
            "serve": built.serve,
            "notes": built.notes,
        }
    return exports


def _public_names(local_target: str, public_target: str) -> dict[str, str]:
    """The local names of the target (as given, and resolved when it is a directory) -> its Hub id."""
    known = {local_target: public_target}
    if Path(local_target).expanduser().exists():
        known[str(Path(local_target).expanduser().resolve())] = public_target
    return known


def upload(folder: Path, repo: str, private: bool, revision: str | None, message: str) -> str:
    """create_repo + upload_folder; returns the commit URL. The token is read by huggingface_hub itself."""
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise ValueError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (or use --dry-run DIR)")
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id=repo, branch=revision, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo,
            folder_path=str(folder),
            repo_type="model",
            revision=revision,
            commit_message=message,
        )
    except HfHubHTTPError as err:
        raise UserError(f"the Hub refused the upload to {repo}: {str(err).splitlines()[0][:200]}") from None
    except Exception as err:
        if not _network_error(err):
            raise
        raise UserError(
            f"cannot reach the Hugging Face Hub ({type(err).__name__}: {str(err)[:100]}); nothing was uploaded. "
            "Retry when online, or write the folder with --dry-run DIR and upload it later"
        ) from None
    return str(getattr(info, "commit_url", info))


def _network_error(err: BaseException) -> bool:
    """A connection, DNS, timeout or offline-mode failure, whichever HTTP library huggingface_hub uses."""
    names = {c.__name__ for c in type(err).__mro__}
    return bool(
        names
        & {
            "ConnectError",
            "NetworkError",
            "TransportError",
            "TimeoutException",
            "ConnectionError",
            "Timeout",
            "OfflineModeIsEnabled",
        }
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a draftsmith drafter checkpoint (a training run's final/)")
    p.add_argument("--repo", required=True, help="the Hub repository, ORG/NAME (created if absent)")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default=None, help="branch to push to (created if absent; default main)")
    p.add_argument(
        "--eval",
        action="append",
        default=None,
        metavar="REPORT",
        help="acceptance report(s) for the card (default: the checkpoint's eval.json); repeatable",
    )
    p.add_argument(
        "--license", default="other", help="license identifier for the card metadata (default other)"
    )
    p.add_argument("--target", default=None, help="the target directory / Hub id (default: the checkpoint's)")
    p.add_argument(
        "--target-repo",
        default=None,
        metavar="ORG/NAME",
        help="the target's Hub id, named in the card and configs (required when the target is a local directory)",
    )
    p.add_argument("--allow-unmeasured", action="store_true", help="push without an acceptance report")
    p.add_argument(
        "--engine-report",
        type=Path,
        action="append",
        default=[],
        metavar="REPORT",
        help="an `engine-eval --report` file: the card states vLLM's own measurement, and with --depths the "
        "vLLM export drafts the depth vLLM measured fastest; repeatable, one per data set (the depth is then "
        "the fastest on the geometric mean of the sets' speedups)",
    )
    p.add_argument(
        "--baseline-eval",
        type=Path,
        action="append",
        default=[],
        metavar="REPORT",
        help="a baseline's acceptance report (`draftsmith eval --drafter ngram`, on the same prompts and settings "
        "as an --eval report): the card cites it beside the drafter's, by name; repeatable",
    )
    p.add_argument(
        "--dry-run", default=None, metavar="DIR", help="write the folder that would be uploaded; no upload"
    )
    p.add_argument("--message", default=None, help="commit message")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    check_repo_id(args.repo, "--repo")
    reports = [Path(f) for f in args.eval] if args.eval else None
    if args.dry_run:
        summary = stage(
            args.checkpoint,
            Path(args.dry_run),
            args.repo,
            reports,
            args.license,
            args.allow_unmeasured,
            args.target,
            args.target_repo,
            args.engine_report,
            args.baseline_eval,
        )
        files = sorted(str(p.relative_to(args.dry_run)) for p in Path(args.dry_run).rglob("*") if p.is_file())
        print(
            f"dry run: {len(files)} files in {args.dry_run} (engines: {', '.join(summary['engines'])}); "
            "nothing uploaded"
        )
        for f in files:
            print(f"  {f}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "upload"
        stage(
            args.checkpoint,
            folder,
            args.repo,
            reports,
            args.license,
            args.allow_unmeasured,
            args.target,
            args.target_repo,
            args.engine_report,
            args.baseline_eval,
        )
        message = args.message or f"draftsmith: {read_source(args.checkpoint)['kind']} drafter"
        url = upload(folder, args.repo, args.private, args.revision, message)
    print(f"pushed {args.checkpoint} to https://huggingface.co/{args.repo} ({url})")
    return 0
