"""Which configuration file the ``adarag`` command reads, and the configuration it gives.

One file is read, the first of: ``--config FILE``, the file ``$ADARAG_CONFIG`` names, and the
default file ``$ADARAG_HOME/config.json`` when it exists; without one, the defaults. Command-line
options apply over the file. Files are not merged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from adarag.config.base import default_home
from adarag.config.root import AdaRagConfig
from adarag.errors import ConfigError

CONFIG_ENV = "ADARAG_CONFIG"
"""Environment variable naming the configuration file when ``--config`` is not given."""
DEFAULT_CONFIG_FILE = "config.json"
"""The default configuration file's name, in the home (``$ADARAG_HOME``)."""
FROM_OPTION, FROM_ENV, FROM_DEFAULT = "--config", f"${CONFIG_ENV}", "the default file"
"""What named a configuration file (:attr:`ConfigSource.origin`)."""


@dataclass(frozen=True)
class ConfigSource:
    """A configuration file and what named it.

    Attributes:
        path: The JSON file of ``AdaRagConfig`` fields.
        origin: ``"--config"``, ``"$ADARAG_CONFIG"`` or ``"the default file"``.
    """

    path: Path
    origin: str


def find_config_file(explicit: str | Path | None = None) -> ConfigSource | None:
    """The configuration file to read: ``explicit``, else ``$ADARAG_CONFIG``, else the default.

    Args:
        explicit: The file given on the command line (``--config``); None when none was.

    Returns:
        The file and its origin; None when none is named and the default file does not exist.
    """
    if explicit is not None and str(explicit):
        return ConfigSource(Path(explicit).expanduser(), FROM_OPTION)
    named = os.environ.get(CONFIG_ENV)
    if named:
        return ConfigSource(Path(named).expanduser(), FROM_ENV)
    default = default_config_file()
    if default.exists() or default.is_symlink():
        return ConfigSource(default, FROM_DEFAULT)
    return None


def default_config_file() -> Path:
    """``$ADARAG_HOME/config.json`` (the home before any file sets ``home``)."""
    return default_home() / DEFAULT_CONFIG_FILE


def discover_config(explicit: str | Path | None = None) -> AdaRagConfig:
    """The configuration from the file :func:`find_config_file` finds, or the defaults.

    Raises:
        ConfigError: The file cannot be read or is not a valid configuration; the message names
            what named the file.
    """
    source = find_config_file(explicit)
    if source is None:
        return AdaRagConfig()
    return load_config_file(source)


def load_config_file(source: ConfigSource) -> AdaRagConfig:
    """The configuration in ``source``'s file.

    Raises:
        ConfigError: The file cannot be read or is not a valid configuration; a file that did not
            come from ``--config`` is named by its origin.
    """
    try:
        return AdaRagConfig.from_file(source.path)
    except ConfigError as err:
        if source.origin == FROM_OPTION:
            raise
        fix = "fix or remove it" if source.origin == FROM_DEFAULT else f"unset {CONFIG_ENV}"
        raise ConfigError(f"{err} (the file came from {source.origin}; or {fix})") from err
