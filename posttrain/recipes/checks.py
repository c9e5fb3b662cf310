"""A recipe's stage configs, checked before its first stage runs.

Each stage that takes a config (sft, train, eval) is loaded as its command line would load it (its preset,
then every override) and checked by the config's own rules (``config/validate.py``) and by its built-in
dataset's preparer (``builtin_option_problems`` in ``trainer/data_setup.py``, which ``posttrain config`` runs
too). A mistake in a late stage's overrides (a key misspelt, an option its preparer refuses) then stops the
recipe at its start, not after the hours of the stages before it. The checks that need a stage's inputs (the
model an earlier stage exports, a checkpoint) are left to the stage's own start, since those do not exist yet.
A stage that finished is checked too (whether it will be skipped is decided as the stages run): a rule added
since refuses it, which its own rerun would.
"""

from __future__ import annotations

from collections.abc import Iterable

from posttrain.errors import ConfigError

CONFIG_COMMANDS = ("sft", "train", "eval")
# where a stage's settings come from, as a refused one is labelled (the recipe builds the stage's command line)
STAGE_SETTINGS = "the recipe's settings for this stage"


def stage_problems(argv: list[str], command: str) -> str | None:
    """What is wrong with the config of a stage run as ``argv`` (``stage_argv``'s), or None. A stage with no preset
    is checked from the one its command starts from (``DEFAULT_PRESET`` for train and eval, as the CLI's)."""
    from posttrain.config import load_config
    from posttrain.config.loader import DEFAULT_PRESET, preset_path
    from posttrain.config.validate import validate_config
    from posttrain.trainer.data_setup import builtin_option_problems

    presets: list[str] = []
    settings: list[str] = []
    rest = iter(argv[4:])  # after python -m posttrain.cli COMMAND
    for item in rest:
        if item == "--preset":
            presets.append(next(rest))
        elif item.startswith("--"):
            next(rest, None)  # --dump-episodes PATH, --checkpoint DIR
        else:
            settings.append(item)
    presets = presets or ([DEFAULT_PRESET] if command in ("train", "eval") else [])
    try:
        load_config([preset_path(name) for name in presets], settings, overrides_source=STAGE_SETTINGS,
                    checks=lambda config: validate_config(config, command) + builtin_option_problems(config.data))
    except ConfigError as error:
        return str(error)
    return None


def check_stages(stages: Iterable[tuple[str, str, list[str]]]) -> list[str]:
    """``(name, command, argv)`` of the stages to run → one line per stage whose config is refused."""
    found = []
    for name, command, argv in stages:
        if command in CONFIG_COMMANDS and (problem := stage_problems(argv, command)):
            found.append(f"stage {name!r}: {problem}")
    return found
