"""Preflight: everything a command would refuse in a config, found before any worker starts.

:func:`check_config` is the one place where a command's config is judged. ``posttrain train``,
``eval`` and ``sft`` load their config through :func:`load_run_config`, which runs it for that
command; ``posttrain config`` runs it for the command named by ``--for``, or else the one the config
is for (:func:`implied_command`), so that it refuses exactly what that command would. The trainers
take the config as checked and judge only what depends on the data (e.g. a schedule's warm-up
against the number of steps the dataset gives).

``config/validate.py`` holds the config's own rules (choices, ranges, batch arithmetic; the algorithm's settings in
``config/algorithm_checks.py``). The rules here
belong to the pieces a run will build, and each is asked of that piece, so that it is written once:
the training engine's settings (optimizer, schedule, dtype, LoRA) and the rollout engine's sampling
settings, built from the config exactly as the workers build them (``workers/engines.py``); the
names the algos registries know; the estimator's needs (values need a critic, a group baseline
needs several samples per prompt); the environment class and its options (``rollout/environments.py``);
tracker names; and the models and files the run reads. Every problem comes in one report, each
labelled by the loader with where its key was set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig, load_config
from posttrain.config.schema import SFTConfig
from posttrain.config.algorithm_checks import advantage_estimator_of, critic_enabled
from posttrain.config.validate import CHOICES, get, validate_config
from posttrain.errors import InputError, InvalidSettings, Problem
from posttrain.trainer.data_setup import builtin_option_problems

COMMANDS = ("train", "eval", "sft")  # the commands that run a config; ``posttrain config`` checks for one of them


def load_run_config(
    yaml_files: Iterable[str | Path] = (), overrides: Sequence[str] = (), command: str | None = "train",
) -> PosttrainConfig:
    """The config for ``command`` (train, eval, sft; None: the one the config implies), or a
    :class:`~posttrain.errors.ConfigError` with everything that command would refuse."""
    return load_config(yaml_files, overrides, checks=lambda config: check_config(config, command or implied_command(config)))


def implied_command(config: PosttrainConfig) -> str:
    """``sft`` for a config whose ``sft`` section differs from the defaults (as the SFT presets' does),
    else ``train``: the command ``posttrain config`` checks for when ``--for`` does not name one."""
    return "sft" if config.sft != SFTConfig() else "train"


def check_config(config: PosttrainConfig, command: str) -> list[Problem]:
    """Every problem ``posttrain <command>`` (train, eval, sft) refuses ``config`` for: the config's own
    rules (``config/validate.py``) and those of the pieces the run builds (below); returned, not raised."""
    from posttrain.trainer.tracking import unknown_trackers

    if command not in COMMANDS:
        raise ValueError(f"command={command!r}: the checks are for one of {', '.join(COMMANDS)}")
    problems = validate_config(config, command) + check_names(config) + check_engines(config) + check_paths(config)
    if command == "train":  # SFT and evaluation run no RL update
        problems += check_estimator_needs(config)
    unknown = unknown_trackers(config.trainer.logger)
    if unknown:
        problems.append(Problem("trainer.logger", config.trainer.logger, unknown))
    problems += check_environment(config) if config.env.name is not None else unused_tools(config)
    problems += guidance_rollout(config)
    problems += check_mixture(config, command) + builtin_option_problems(config.data)
    if command == "sft":
        sft = config.sft
        problems += engine_problems(config, "sft", sft.optim, sft.grad_clip)
        problems += file_problems("sft.train_files", sft.train_files) + file_problems("sft.val_files", sft.val_files)
    return problems


def check_mixture(config: PosttrainConfig, command: str) -> list[Problem]:
    """A ``mixture``'s own rules (config/mixture.py), then each source's config judged as a run's would be
    (its environment, its files, its rubric, its sections' rules), each problem named by its source
    (``mixture[i].env.options``); the run's own sections are judged once, at the top."""
    from posttrain.config.mixture import mixture_problems, mixture_sources

    problems = mixture_problems(config)
    if problems or not config.mixture:
        return problems
    if command == "sft":
        return [Problem("mixture", [source.get("name") for source in config.mixture],
                        "posttrain sft trains on one set of transcripts: give sft.train_files and leave the mixture out")]
    own_problems = validate_config(config, command) + check_paths(config) + builtin_option_problems(config.data)
    top = {(p.key, p.message) for p in own_problems}  # the run's own, reported once
    for index, source in enumerate(mixture_sources(config)):
        own = source.config
        found = validate_config(own, command) + check_paths(own) + builtin_option_problems(own.data)
        found += check_environment(own) if own.env.name is not None else unused_tools(own)
        problems += [replace(p, key=f"mixture[{index}].{p.key}") for p in found if (p.key, p.message) not in top]
    return problems


def check_names(config: PosttrainConfig) -> list[Problem]:
    """Names that select functions, checked against the algos registries (and, for the policy loss,
    its options against its signature, by the worker's own construction)."""
    from posttrain.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

    actor = config.actor_rollout_ref.actor
    names = (
        ("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, "advantage estimator"),
        ("actor_rollout_ref.actor.policy_loss", POLICY_LOSSES, "policy loss"),
        ("actor_rollout_ref.actor.kl_loss_type", KL_ESTIMATORS, "KL estimator"),
        ("algorithm.kl_penalty", KL_ESTIMATORS, "KL estimator"),
    )
    problems = [
        Problem(key, get(config, key), f"unknown {what}; choose one of {', '.join(registry)}")
        for key, registry, what in names
        if get(config, key) not in registry
    ]
    if actor.policy_loss in POLICY_LOSSES and actor.loss_agg_mode in CHOICES["actor_rollout_ref.actor.loss_agg_mode"]:
        from posttrain.workers.objectives import PolicyObjective

        try:
            PolicyObjective.from_config(actor, config.data.max_response_length)
        except InputError as error:
            problems.append(Problem("actor_rollout_ref.actor.policy_loss", actor.policy_loss, str(error)))
    return problems


def check_estimator_needs(config: PosttrainConfig) -> list[Problem]:
    """What the advantage estimator declares: values need a critic; a group baseline needs n >= 2."""
    name, n = config.algorithm.adv_estimator, config.actor_rollout_ref.rollout.n
    estimator = advantage_estimator_of(config)
    problems = []
    if estimator is not None and estimator.needs_values and not critic_enabled(config):
        problems.append(Problem("critic.enable", config.critic.enable,
                                f"algorithm.adv_estimator={name} needs a critic's values: set critic.enable=true "
                                "(or null), or choose an estimator without a critic (grpo, rloo, reinforce_plus_plus)"))
    if estimator is not None and estimator.needs_groups and n < 2:
        problems.append(Problem("actor_rollout_ref.rollout.n", n,
                                f"algorithm.adv_estimator={name} compares the samples of each prompt: set "
                                "rollout.n >= 2 (4-8 is usual), or use reinforce_plus_plus or gae with one sample per prompt"))
    return problems


def check_engines(config: PosttrainConfig) -> list[Problem]:
    """The engines' own rules applied to the settings the workers will build, mapped to config keys."""
    from posttrain.workers.engines import env_llm_params, generation_params

    arr = config.actor_rollout_ref
    problems = engine_problems(config, "actor_rollout_ref.actor", arr.actor.optim, arr.actor.grad_clip)
    problems += missing_engine("actor_rollout_ref.rollout.name", arr.rollout.name)
    if critic_enabled(config):
        problems += engine_problems(config, "critic", config.critic.optim, config.critic.grad_clip)
    samplers = [("actor_rollout_ref.rollout", lambda: generation_params(arr.rollout, 1, validation=False, seed=None)),
                ("actor_rollout_ref.rollout.val_kwargs", lambda: generation_params(arr.rollout, 1, validation=True, seed=None))]
    if config.env.name is not None:
        samplers.append(("env.llm", lambda: env_llm_params(config.env.llm, seed=None)))
    for section, build in samplers:
        try:
            build()
        except InvalidSettings as error:
            problems += [replace(p, key=f"{section}.{p.key}") for p in error.problems if p.key in SAMPLING_FIELDS]
    return problems


def missing_engine(key: str, name: str) -> list[Problem]:
    """A rollout engine ``name`` (at ``key``) whose library is not installed: vLLM, named with the line
    that installs it."""
    import importlib.util

    if name != "vllm" or importlib.util.find_spec("vllm") is not None:
        return []
    from posttrain.engines.rollout.vllm_engine import VLLM_HINT

    return [Problem(key, name, f"vllm is not installed; {VLLM_HINT}")]


# GenerationParams fields named alike under each sampling section (lengths and n are checked as batch settings)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


def engine_problems(config: PosttrainConfig, section: str, optim: Any, grad_clip: float | None) -> list[Problem]:
    """The training engine's rules for ``section`` (``actor_rollout_ref.actor``, ``critic``, ``sft``) with
    its ``optim`` and ``grad_clip``; the schedule's length depends on the data and is judged at start."""
    from posttrain.workers.engines import ENGINE_FIELD_KEYS, training_engine_config

    arr = config.actor_rollout_ref
    try:
        training_engine_config("model", arr.model, optim, dtype=arr.actor.dtype, grad_clip=grad_clip,
                               total_steps=max(1, optim.warmup_steps), device=config.trainer.device)
    except InvalidSettings as error:
        return [replace(p, key=_engine_key(section, ENGINE_FIELD_KEYS[p.key])) for p in error.problems]
    return []


def _engine_key(section: str, field_key: str) -> str:
    if field_key.startswith("model."):
        return f"actor_rollout_ref.{field_key}"
    if field_key == "dtype":
        return "actor_rollout_ref.actor.dtype"
    return field_key if field_key.startswith("trainer.") else f"{section}.{field_key}"


def check_environment(config: PosttrainConfig) -> list[Problem]:
    """``env.name`` (or ``env.path`` + ``env.class_name``) names an environment, and ``env.options``
    build one (the environment's own checks, run on one built with stand-ins for its resources)."""
    from posttrain.rollout.environments import load_env_class, probe_environment, wanted_resources

    env = config.env
    try:
        env_class = load_env_class(env.name, env.path, env.class_name)
    except InputError as error:
        key = "env.name" if env.path is None else "env.class_name" if not env.class_name else "env.path"
        return [Problem(key, get(config, key), str(error))]
    try:
        probe_environment(env_class, env.options)
    except (ValueError, TypeError) as error:
        return [Problem("env.options", dict(env.options), str(error))]
    wanted = wanted_resources(env_class, env.options)
    problems = missing_engine("env.llm.rollout", env.llm.rollout) if "env_llm" in wanted and env.llm.url is None else []
    if "toolbox" in wanted:  # its class takes the run's tools
        return problems + check_tools(config) + single_turn_calls(config)
    return problems + unused_tools(config)


def single_turn_calls(config: PosttrainConfig) -> list[Problem]:
    """Where the calls are the answer (``env.options.answer: calls``) the rollout is single-turn
    (rollout/calls.py): the settings of episodes' batches do not apply, so they are refused, not ignored."""
    from posttrain.tools.env import answer_mode

    env = config.env
    if not answer_mode(env.options).calls_are_the_answer:
        return []
    why = "with env.options.answer=calls each response is one answer scored as a single-turn rollout's (rollout/calls.py)"
    problems = []
    if env.filter_groups_quantile > 0:
        problems.append(Problem("env.filter_groups_quantile", env.filter_groups_quantile,
                                f"{why}; set it to 0, or use algorithm.filter_groups (dynamic sampling)"))
    return problems


def guidance_rollout(config: PosttrainConfig) -> list[Problem]:
    """Guidance (rollout/guidance.py) replaces a single-turn response with the row's reference answer: an
    environment's multi-turn episodes have no such answer to put in."""
    from posttrain.rollout.calls import answers_with_calls

    if not config.algorithm.guidance.enable or config.env.name is None or answers_with_calls(config.env):
        return []
    return [Problem("algorithm.guidance.enable", True, f"env.name={config.env.name} plays multi-turn episodes; guidance replaces a "
                    "single-turn answer with the row's extra_info.reference_answer (single-turn rows, or env.options.answer=calls)")]


def unused_tools(config: PosttrainConfig) -> list[Problem]:
    """``env.tools`` or ``env.mcp_servers`` set for a run whose environment takes no tools (or that
    has none: a single-turn run)."""
    env = config.env
    if not (env.tools or env.mcp_servers):
        return []
    key = "env.tools" if env.tools else "env.mcp_servers"
    return [Problem(key, get(config, key), f"is read only by an environment that takes tools: set env.name=tools "
                                            f"({env.name!r} takes none)")]


def check_tools(config: PosttrainConfig) -> list[Problem]:
    """Every ``env.tools`` entry loads and can be described to the model, and ``env.tool_format`` and
    ``env.tool_parser`` exist and fit (MCP servers are asked for their tools when the run starts them)."""
    from posttrain.models.tool_formats import FORMATS, format_names, parser_names
    from posttrain.tools import ToolSpecError, load_tools

    env, problems = config.env, []  # no tools at all is for rows that bring their own (ToolEnv.reset refuses a row with none)
    for spec in env.tools:  # each entry on its own, so every bad one is named
        try:
            load_tools([spec])
        except ToolSpecError as error:
            problems.append(Problem("env.tools", list(env.tools), str(error)))
    if env.tool_parser != "auto" and env.tool_parser not in parser_names():
        problems.append(Problem("env.tool_parser", env.tool_parser, f"is not a tool-call parser; use auto or one of {', '.join(parser_names())}"))
    if env.tool_format != "auto" and env.tool_format not in FORMATS:
        problems.append(Problem("env.tool_format", env.tool_format, f"is not a tool format; use auto or one of {', '.join(format_names())}"))
    elif env.tool_format != "auto":
        try:  # a format that reads its own calls refuses a parser (nothing is rendered or parsed here)
            FORMATS[env.tool_format](None, [], env.tool_parser)
        except InputError as error:
            problems.append(Problem("env.tool_parser", env.tool_parser, str(error)))
    return problems


def check_paths(config: PosttrainConfig) -> list[Problem]:
    """Models and files the run reads must exist (a Hub id is looked up when the run starts, and says
    so if it cannot be had)."""
    from posttrain.models.loading import model_path_problem

    models = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path)]
    if critic_enabled(config) and config.critic.model_path:
        models.append(("critic.model_path", config.critic.model_path))
    if config.reward_model.enable:
        models.append(("reward_model.model_path", config.reward_model.model_path))
    problems = []
    for key, path in models:
        problem = "required with reward_model.enable=true: the reward model's directory" if path is None else model_path_problem(path)
        if problem:
            problems.append(Problem(key, path, problem))
    problems += share_prompt_problems(config, [path for key, path in models if key != "reward_model.model_path"])
    # with data.builtin, a bare file name in data.val_files / data.dev_files names one of the built-in dataset's splits (found when it is written)
    problems += file_problems("data.train_files", config.data.train_files)
    for key in ("data.val_files", "data.dev_files"):
        problems += file_problems(key, [f for f in get(config, key) if not (config.data.builtin and not config.data.train_files and Path(f).name == f)])
    if config.custom_reward_function.path:
        problems += file_problems("custom_reward_function.path", [config.custom_reward_function.path])
    problems += rubric_problems(config)
    if config.env.retriever.corpus:
        problems += file_problems("env.retriever.corpus", [config.env.retriever.corpus])
    mode = config.trainer.resume_mode
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        problems.append(Problem("trainer.resume_mode", mode,
                                "must be auto (the latest checkpoint, if any), disable, or an existing global_step_N directory"))
    return problems


def rubric_problems(config: PosttrainConfig) -> list[Problem]:
    """``reward.rubric``'s parts built as the run builds them (names, weights, rules; rewards/rubric.py), and
    alone: it scores every sample, so a custom function or the batch manager beside it is refused."""
    from posttrain.rewards.rubric import build_rubric

    parts = [dict(part) if isinstance(part, Mapping) else part for part in config.reward.rubric]
    if not parts:
        return []
    if config.custom_reward_function.path or config.reward_model.reward_manager == "batch":
        return [Problem("reward.rubric", parts, "scores every sample: leave custom_reward_function.path unset (and the batch reward "
                                                "manager), or make that function a part (rule: FILE.py:FUNCTION)")]
    if not all(isinstance(part, dict) for part in parts):
        return [Problem("reward.rubric", parts, "each part is a mapping {name, weight, rule}")]
    try:
        build_rubric(parts)
    except (ValueError, TypeError) as error:
        return [Problem("reward.rubric", parts, str(error))]
    return []


def share_prompt_problems(config: PosttrainConfig, model_paths: list[str]) -> list[Problem]:
    """``actor_rollout_ref.model.share_prompt`` on a local model whose attention cannot take its mask
    (a Hub id is judged when the engine starts: it refuses it the same way)."""
    from posttrain.engines.training.modeling import shared_prompt_problem
    from posttrain.models.loading import BUILTIN_MODELS

    model = config.actor_rollout_ref.model
    if not (model.share_prompt and model.use_remove_padding):
        return []
    from transformers import AutoConfig

    problems = []
    for path in model_paths:
        if path in BUILTIN_MODELS or not (Path(path).expanduser() / "config.json").is_file():
            continue
        # attention not judged: the config's choices (auto, eager, sdpa) all take the layout's mask
        problem = shared_prompt_problem(AutoConfig.from_pretrained(Path(path).expanduser()), None)
        if problem:
            problems.append(Problem("actor_rollout_ref.model.share_prompt", True, f"cannot run {path}: {problem}; set it to false"))
    return problems


def file_problems(key: str, paths: list[str]) -> list[Problem]:
    """Each of ``paths`` (the value of ``key``) that is missing or is a directory."""
    problems = []
    for path in paths:
        if Path(path).is_dir():
            problems.append(Problem(key, path, "is a directory; name the file(s) in it, e.g. [dir/train.parquet]"))
        elif not Path(path).is_file():
            problems.append(Problem(key, path, f"no such file (looked at {Path(path).resolve()})"))
    return problems
