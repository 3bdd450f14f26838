"""Build the wheels of adarag and its two integration packages, and install them as a user would.

``python scripts/wheels.py`` (``make wheels``) runs ``python -m build`` on the project and on
``integrations/llama_index`` and ``integrations/langchain`` into ``dist/``; then, in a fresh
virtual environment outside the source tree, it installs the CPU build of torch first (so that
nothing pulls a CUDA build), then the three wheels from ``dist/`` with their dependencies, and
runs ``adarag --version``, imports the three packages and reads every packaged model profile
(with the packet file it names) from there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = (ROOT, ROOT / "integrations" / "llama_index", ROOT / "integrations" / "langchain")
WHEELS = ("adarag-*.whl", "llama_index_packs_adarag-*.whl", "langchain_adarag-*.whl")
TORCH = "torch==2.13.0"  # the release the core caps; its CPU wheel lies on the machine's disk
IMPORTS = "import adarag, langchain_adarag, llama_index.packs.adarag; print(adarag.__file__)"
PROFILES = (  # every packaged profile reads, with the packet file it names (digest checked)
    "from importlib import resources; from adarag.profiles import ModelProfile; "
    "folder = resources.files('adarag.profiles'); "
    "names = sorted(p.name for p in folder.iterdir() if p.name.endswith('.json')); "
    "packets = [ModelProfile.read(folder, n).packet for n in names]; "
    "print(len(names), 'profiles,', sum(p is not None for p in packets), 'with a packet')"
)


def build(dist: Path) -> list[Path]:
    """``python -m build`` of each project into ``dist``; returns the three wheels."""
    dist.mkdir(parents=True, exist_ok=True)
    for old in dist.glob("*.whl"):
        old.unlink()
    for project in PROJECTS:
        _run([sys.executable, "-m", "build", "--outdir", str(dist), str(project)])
    wheels = [next(iter(sorted(dist.glob(pattern))), None) for pattern in WHEELS]
    missing = [pattern for pattern, wheel in zip(WHEELS, wheels, strict=True) if wheel is None]
    if missing:
        sys.exit(f"python -m build made no {', '.join(missing)} in {dist}")
    return [wheel for wheel in wheels if wheel is not None]


def install_and_run(wheels: list[Path], scratch: Path) -> str:
    """A fresh venv in ``scratch`` with the wheels installed; returns ``adarag --version``."""
    environment = scratch / "venv"
    venv.create(environment, with_pip=True, clear=True)
    python, adarag = environment / "bin" / "python", environment / "bin" / "adarag"
    _run([str(python), "-m", "pip", "install", "--quiet", TORCH], cwd=scratch)
    _run([str(python), "-m", "pip", "install", "--quiet", *map(str, wheels)], cwd=scratch)
    version = _run([str(adarag), "--version"], cwd=scratch)
    location = _run([str(python), "-c", IMPORTS], cwd=scratch)
    if not Path(location).is_relative_to(environment):
        sys.exit(f"adarag was imported from {location}, not from the fresh environment")
    _say("packaged " + _run([str(python), "-c", PROFILES], cwd=scratch))
    return version


def _run(command: list[str], cwd: Path = ROOT) -> str:
    _say("$ " + " ".join(command))
    # the caller's PYTHONPATH would show a source tree (and its egg-info) to the fresh venv's pip
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    return result.stdout.strip()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    """Build the wheels into ``--dist``, then install and run them in a fresh venv."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where wheels go")
    args = parser.parse_args()
    wheels = build(args.dist.resolve())
    _say("built " + ", ".join(wheel.name for wheel in wheels))
    with tempfile.TemporaryDirectory(prefix="adarag-wheels-") as scratch:
        _say(
            "installed in a fresh venv, `adarag --version`: "
            + install_and_run(wheels, Path(scratch))
        )


if __name__ == "__main__":
    main()
