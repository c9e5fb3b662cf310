"""The typed config tree, its loader (YAML + dotted overrides) and its own rules; the error the loader
raises is :class:`posttrain.errors.ConfigError`, re-exported here."""

from posttrain.config.loader import load_config, preset_names, preset_path, to_yaml
from posttrain.config.schema import PosttrainConfig
from posttrain.errors import ConfigError

__all__ = ["ConfigError", "PosttrainConfig", "load_config", "preset_names", "preset_path", "to_yaml"]
