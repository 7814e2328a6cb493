"""The pipeline's target: a preset built once into the user cache, a directory, a .gguf file or a Hub id."""

from __future__ import annotations

import json
import re
from pathlib import Path

from draftsmith.models.gguf import PACKAGED, build_packaged
from draftsmith.toy.build import default_target_dir
from draftsmith.toy.target import PRESETS, build_toy_target

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # ORG/NAME on the Hugging Face Hub


def resolve_target(name: str, progress: bool = True) -> tuple[Path, bool]:
    """`(target directory, .gguf file or Hub id, is a toy target)`; a preset is built into the user cache once;
    an ORG/NAME that is no local path is a Hub id, which transformers downloads when the target loads."""
    if name in PACKAGED or name in PRESETS:
        path = default_target_dir(name, 0)
        if not (path / "build.json").is_file():
            print(f"building the {name!r} target in {path} (once)")
            if name in PACKAGED:
                build_packaged(name, path)
            else:
                build_toy_target(name, path, seed=0, force=True, progress=progress)
        return path, name in PRESETS
    path = Path(name).expanduser()
    if not path.exists() and HUB_ID.match(name):
        return path, False
    if not path.exists():
        raise FileNotFoundError(
            f"--target {name}: no such directory or file, and not a preset; expected one of "
            f"{', '.join(sorted(PACKAGED) + sorted(PRESETS))}, a target directory, a .gguf file or a Hub id ORG/NAME"
        )
    return path, _is_toy(path)


def _is_toy(path: Path) -> bool:
    build = path / "build.json"
    return build.is_file() and json.loads(build.read_text()).get("preset") in PRESETS
