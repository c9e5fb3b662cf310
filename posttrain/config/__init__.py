"""The typed config tree, its loader (YAML + dotted overrides) and its validation."""

from posttrain.config.loader import ConfigError, ConfigProblem, load_config, preset_names, preset_path, to_yaml
from posttrain.config.schema import PosttrainConfig

__all__ = ["ConfigError", "ConfigProblem", "PosttrainConfig", "load_config", "preset_names", "preset_path", "to_yaml"]
