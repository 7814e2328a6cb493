"""Push a drafter to the Hugging Face Hub with a model card that states what was measured.

    draftsmith push CKPT --repo ORG/NAME [--private] [--revision BRANCH] [--eval FILE ...] [--dry-run DIR]

The uploaded folder is:
- the draftsmith checkpoint at the root (what `draftsmith eval --drafter ORG/NAME` loads), with `eval.json`;
- `engines/<engine>/`: the drafter exported for each engine that serves its kind, every export validated
  against the target first (`draftsmith export`); a distilled draft LM is itself the transformers directory
  engines load, so its root is what they serve;
- README.md: the model card (YAML metadata: base_model, library_name, tags, license; the tau table and
  per-depth acceptance from the acceptance reports; the recipe and data; copy-paste vLLM / SGLang commands).

A drafter without an acceptance report is refused (`draftsmith eval ... --save-eval` writes one) unless
--allow-unmeasured. `--dry-run DIR` writes exactly the folder that would be uploaded and uploads nothing.
The token comes from the usual place (HF_TOKEN, or `hf auth login`'s cache) and is never printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .export import LAYOUTS, export, read_source
from .model_card import HUB_ID, render_card

ENGINE_FOLDER = "engines"


def stage(
    ckpt: str | Path, folder: Path, repo: str, reports: list[Path] | None = None, license_id: str = "other",
    allow_unmeasured: bool = False, target: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write the folder that `push` uploads into `folder` (must not exist or be empty); returns a summary."""
    src = Path(ckpt).expanduser()
    source = read_source(src)
    report_files = list(reports or [])
    if not report_files and (src / "eval.json").is_file():
        report_files = [src / "eval.json"]
    if not report_files and not allow_unmeasured:
        raise ValueError(
            f"{src} has no eval.json: measure the drafter first (`draftsmith eval --target ... --drafter {src} "
            "--data HELDOUT --save-eval`), pass --eval REPORT.json, or push anyway with --allow-unmeasured"
        )
    loaded = []
    for f in report_files:
        try:
            loaded.append(json.loads(Path(f).read_text()))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"--eval {f}: not a readable acceptance report ({err})") from err
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty; --dry-run needs a new or empty directory")
    folder.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():  # the checkpoint itself (a Medusa-2 adapter/ included)
        if item.name in ("README.md", ENGINE_FOLDER) or item.name.endswith((".tmp", ".old")):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, folder / item.name)
    if len(loaded) > 1 or report_files[:1] != [src / "eval.json"]:
        for i, report in enumerate(loaded):  # the reports the card cites travel with it
            name = "eval.json" if i == 0 else f"eval-{i}.json"
            (folder / name).write_text(json.dumps(report, indent=2) + "\n")
    exports: dict[str, dict[str, Any]] = {}
    engines = [e for (k, e) in LAYOUTS if k == source["kind"] and e != "hf"]
    if source["kind"] == "draft_lm":  # the root is the transformers directory engines load
        for engine in engines:
            with tempfile.TemporaryDirectory() as tmp:
                _, _, built = export(src, engine, Path(tmp) / "x", target)
            exports[engine] = {
                "folder": "",
                "layout": built.layout,
                "serve": built.serve,
                "notes": built.notes,
            }
    else:
        for engine in engines:
            out, _, built = export(src, engine, folder / ENGINE_FOLDER / engine, target)
            (out / "eval.json").unlink(missing_ok=True)  # one copy, at the root
            exports[engine] = {"folder": f"{ENGINE_FOLDER}/{engine}", "layout": built.layout,
                               "serve": built.serve, "notes": built.notes}  # fmt: skip
    (folder / "README.md").write_text(render_card(repo, source, loaded, exports, license_id))
    return {"folder": str(folder), "engines": list(exports), "reports": len(loaded)}


def upload(folder: Path, repo: str, private: bool, revision: str | None, message: str) -> str:
    """create_repo + upload_folder; returns the commit URL. The token is read by huggingface_hub itself."""
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise ValueError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (or use --dry-run DIR)")
    api = HfApi()
    api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id=repo, branch=revision, repo_type="model", exist_ok=True)
    info = api.upload_folder(
        repo_id=repo, folder_path=str(folder), repo_type="model", revision=revision, commit_message=message
    )
    return str(getattr(info, "commit_url", info))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a draftsmith drafter checkpoint (a training run's final/)")
    p.add_argument("--repo", required=True, help="the Hub repository, ORG/NAME (created if absent)")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default=None, help="branch to push to (created if absent; default main)")
    p.add_argument("--eval", action="append", default=None, metavar="REPORT",
                   help="acceptance report(s) for the card (default: the checkpoint's eval.json); repeatable")  # fmt: skip
    p.add_argument(
        "--license", default="other", help="license identifier for the card metadata (default other)"
    )
    p.add_argument("--target", default=None, help="the target directory / Hub id (default: the checkpoint's)")
    p.add_argument("--allow-unmeasured", action="store_true", help="push without an acceptance report")
    p.add_argument(
        "--dry-run", default=None, metavar="DIR", help="write the folder that would be uploaded; no upload"
    )
    p.add_argument("--message", default=None, help="commit message")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if not HUB_ID.match(args.repo):
        raise ValueError(f"--repo {args.repo!r}: expected ORG/NAME (letters, digits, '-', '_', '.')")
    reports = [Path(f) for f in args.eval] if args.eval else None
    if args.dry_run:
        summary = stage(args.checkpoint, Path(args.dry_run), args.repo, reports, args.license,
                        args.allow_unmeasured, args.target)  # fmt: skip
        files = sorted(str(p.relative_to(args.dry_run)) for p in Path(args.dry_run).rglob("*") if p.is_file())
        print(f"dry run: {len(files)} files in {args.dry_run} (engines: {', '.join(summary['engines'])}); "
              "nothing uploaded")  # fmt: skip
        for f in files:
            print(f"  {f}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "upload"
        stage(args.checkpoint, folder, args.repo, reports, args.license, args.allow_unmeasured, args.target)
        message = args.message or f"draftsmith: {read_source(args.checkpoint)['kind']} drafter"
        url = upload(folder, args.repo, args.private, args.revision, message)
    print(f"pushed {args.checkpoint} to https://huggingface.co/{args.repo} ({url})")
    return 0
