"""Secret keys in the configuration: from the environment or a private file, never echoed.

A signing key comes from a setting, an environment variable or a key file. A key file is read
like ssh reads a private key: it must belong to this user (or root) and be neither readable nor
writable by anyone else, or it is refused with the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import SecretStr

from adarag.config.base import _read_config_file
from adarag.errors import ConfigError

MIN_SIGNING_KEY_BYTES = 16


def secret_from_env(name: str, *, check: bool = True) -> SecretStr | None:
    """The value of environment variable ``name`` as a secret; None when unset or empty.

    Args:
        name: The variable.
        check: Refuse a value too short for a signing key (a password is not checked).

    Raises:
        ConfigError: ``check``, and the value is too short for a key, or a placeholder.
    """
    value = os.environ.get(name)
    if not value:
        return None
    if check:
        try:
            check_key(value, f"${name}")
        except ValueError as err:
            raise ConfigError(f"{err}, or unset ${name}") from None
    return SecretStr(value)


def check_key(key: str, what: str) -> None:
    """Refuse a key too short to resist guessing, or one that is a masked placeholder.

    Args:
        key: The key.
        what: Where it came from, for the message (``"signing_key"``, ``"$NAME"``).

    Raises:
        ValueError: The key is too short or a placeholder.
    """
    if len(key.encode()) < MIN_SIGNING_KEY_BYTES:
        raise ValueError(
            f"{what} is shorter than {MIN_SIGNING_KEY_BYTES} bytes; use a long random secret, "
            "e.g. `openssl rand -hex 32`"
        )
    if set(key) == {"*"}:
        raise ValueError(
            f"{what} is a masked placeholder ('****'), not the key; pass the key itself"
        )


def key_bytes(key: SecretStr | None, key_file: Path | None, file_setting: str) -> bytes | None:
    """A key given as a secret, or read from ``key_file`` (named ``file_setting``); None: none.

    Raises:
        ConfigError: The file cannot be read, is open to other users, or its key is too short.
    """
    if key is not None:
        return key.get_secret_value().encode()
    if key_file is None:
        return None
    return read_key_file(key_file, file_setting)


def read_key_file(path: Path, setting: str) -> bytes:
    """The key on the first line of ``path``, once the file is private to this user.

    Args:
        path: The key file.
        setting: The setting that named it, for messages.

    Raises:
        ConfigError: The file cannot be read, others may read or write it, it belongs to
            another user, or its key is too short.
    """
    key = read_secret_file(path, setting).decode()
    try:
        check_key(key, f"the key in {path}")
    except ValueError as err:
        raise ConfigError(f"{setting}: {err}") from None
    return key.encode()


def read_secret_file(path: Path, setting: str) -> bytes:
    """The secret on the first line of ``path``, once the file is private to this user.

    Args:
        path: The file.
        setting: The setting that named it, for messages.

    Raises:
        ConfigError: The file cannot be read, others may read or write it, or it belongs to
            another user.
    """
    try:
        info = os.stat(path)
        text = _read_config_file(path)
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(
            f"cannot read {setting} {path}: {reason}; point it at a readable file holding the "
            "secret"
        ) from None
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{setting} {path} is open to other users (mode {mode:04o}), and a secret must be "
            f"private: run `chmod 600 {path}` (and replace the secret if others could read it)"
        )
    if info.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{setting} {path} belongs to uid {info.st_uid}, not to this user (uid "
            f"{os.geteuid()}) or root; use a file of your own"
        )
    return text.split("\n", 1)[0].strip().encode()
