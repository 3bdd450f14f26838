"""The one configuration tree of adarag: every knob is declared here, validated, and frozen.

Entry points build an :class:`AdaRagConfig` (from keyword overrides, a JSON file or defaults) and
hand each component its own sub-config. Each section lives in a module of its own (``engine``,
``prompt``, ``cache``, ``store``, ``augment``, ``retrieval``, ``serve``, ``chat``; the root and
its error messages in ``root``, the shared base model in ``base``, which file the command reads
in ``discovery``, secret keys in ``secrets``); every name is imported from here.
"""

from __future__ import annotations

from adarag.config.augment import AugmentConfig, AugmentLevers
from adarag.config.base import (
    DEFAULT_MODEL,
    MAX_CONFIG_FILE_BYTES,
    SECRET_FIELDS,
    default_home,
)
from adarag.config.base import _admits_bool as _admits_bool
from adarag.config.base import _check_path as _check_path
from adarag.config.base import _deep_update as _deep_update
from adarag.config.base import _Frozen as _Frozen
from adarag.config.base import _is_section as _is_section
from adarag.config.base import _read_config_file as _read_config_file
from adarag.config.base import _strings as _strings
from adarag.config.cache import CacheConfig, TierConfig
from adarag.config.chat import CONDENSE_PROMPT, ChatConfig
from adarag.config.discovery import (
    CONFIG_ENV,
    DEFAULT_CONFIG_FILE,
    ConfigSource,
    default_config_file,
    discover_config,
    find_config_file,
    load_config_file,
)
from adarag.config.engine import EngineConfig, KernelConfig
from adarag.config.experimental import (
    MOVED,
    ArrangementConfig,
    ExperimentalConfig,
    FusionConfig,
    VariantConfig,
)
from adarag.config.prompt import PromptConfig
from adarag.config.recompute import RecomputeConfig, RecomputeLevers, RecomputeSettings
from adarag.config.retrieval import RetrievalConfig
from adarag.config.root import MAX_MESSAGE_CHARS, AdaRagConfig
from adarag.config.root import _describe as _describe
from adarag.config.root import _is_union_member as _is_union_member
from adarag.config.root import _known_fields as _known_fields
from adarag.config.root import _shown_value as _shown_value
from adarag.config.secrets import MIN_SIGNING_KEY_BYTES, read_key_file, secret_from_env
from adarag.config.serve import ServeConfig
from adarag.config.store import SIGNING_KEY_ENV, StoreConfig, redact_url
from adarag.config.store import _check_signing_key as _check_signing_key
from adarag.config.store import _remote_url_problem as _remote_url_problem

__all__ = [
    "CONDENSE_PROMPT",
    "CONFIG_ENV",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_MODEL",
    "MAX_CONFIG_FILE_BYTES",
    "MAX_MESSAGE_CHARS",
    "MIN_SIGNING_KEY_BYTES",
    "MOVED",
    "SECRET_FIELDS",
    "SIGNING_KEY_ENV",
    "AdaRagConfig",
    "ArrangementConfig",
    "AugmentConfig",
    "AugmentLevers",
    "CacheConfig",
    "ChatConfig",
    "ConfigSource",
    "EngineConfig",
    "ExperimentalConfig",
    "FusionConfig",
    "KernelConfig",
    "PromptConfig",
    "RecomputeConfig",
    "RecomputeLevers",
    "RecomputeSettings",
    "RetrievalConfig",
    "ServeConfig",
    "StoreConfig",
    "TierConfig",
    "VariantConfig",
    "default_config_file",
    "default_home",
    "discover_config",
    "find_config_file",
    "load_config_file",
    "read_key_file",
    "redact_url",
    "secret_from_env",
]
