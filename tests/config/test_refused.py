"""Wrong configurations are refused by `load_run_config` (and so by `posttrain config`, `train`, `eval` and
`sft` before any worker starts), each with a message naming the key, the value, where it came from, and
the fix."""

import ast
import subprocess
import sys
from graphlib import TopologicalSorter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import posttrain.config
from posttrain.rollout.environments import builtin_env_names
from posttrain.config import ConfigError, load_config, preset_names, preset_path, to_yaml
from posttrain.cli.preflight import implied_command, load_run_config

# dynamic sampling keeping 4 dropped groups for the KL loss, which it has
KL_GROUPS = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.kl_groups=4", "actor_rollout_ref.actor.use_kl_loss=true"]

# (overrides, the key the problem names, a fragment of its message)
WRONG = [
    (["algorithm.adv_estimator=gpro"], "algorithm.adv_estimator", "unknown advantage estimator; choose one of gae, grpo"),
    (["actor_rollout_ref.actor.policy_loss=ppo2"], "actor_rollout_ref.actor.policy_loss", "unknown policy loss; choose one of vanilla"),
    (["actor_rollout_ref.actor.kl_loss_type=kl4"], "actor_rollout_ref.actor.kl_loss_type", "unknown KL estimator"),
    (["algorithm.kl_penalty=big"], "algorithm.kl_penalty", "unknown KL estimator"),
    (["actor_rollout_ref.actor.optim.lr=0"], "actor_rollout_ref.actor.optim.lr", "must be > 0"),
    (["actor_rollout_ref.actor.optim.lr=-1e-6"], "actor_rollout_ref.actor.optim.lr", "must be > 0"),
    (["algorithm.adv_estimator=gae", "critic.optim.lr=0"], "critic.optim.lr", "must be > 0"),
    (["actor_rollout_ref.rollout.temperature=-0.5"], "actor_rollout_ref.rollout.temperature", "must be >= 0 (0 means greedy)"),
    (["actor_rollout_ref.rollout.val_kwargs.temperature=-1"], "actor_rollout_ref.rollout.val_kwargs.temperature", "must be >= 0"),
    (["actor_rollout_ref.rollout.top_p=0"], "actor_rollout_ref.rollout.top_p", "must be in (0, 1]"),
    (["actor_rollout_ref.rollout.top_p=1.5"], "actor_rollout_ref.rollout.top_p", "must be in (0, 1]"),
    (["actor_rollout_ref.actor.clip_ratio_low=-0.1"], "actor_rollout_ref.actor.clip_ratio_low", "must be >= 0"),
    (["actor_rollout_ref.actor.clip_ratio_high=-0.2"], "actor_rollout_ref.actor.clip_ratio_high", "must be >= 0"),
    (["actor_rollout_ref.actor.clip_ratio_c=0.5"], "actor_rollout_ref.actor.clip_ratio_c", "must be > 1"),
    (["actor_rollout_ref.actor.policy_loss_skip_first=-1"], "actor_rollout_ref.actor.policy_loss_skip_first", "must be >= 0"),
    (["data.max_response_length=64", "actor_rollout_ref.actor.policy_loss_skip_first=64"], "actor_rollout_ref.actor.policy_loss_skip_first",
     "must be below data.max_response_length=64"),
    (["actor_rollout_ref.actor.kl_loss_first_tokens=-1"], "actor_rollout_ref.actor.kl_loss_first_tokens", "must be >= 0"),
    (["actor_rollout_ref.actor.kl_loss_first_tokens=1"], "actor_rollout_ref.actor.kl_loss_first_tokens",
     "applies only with actor_rollout_ref.actor.use_kl_loss=true"),
    (["data.max_response_length=64", "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_first_tokens=64"],
     "actor_rollout_ref.actor.kl_loss_first_tokens", "must be below data.max_response_length=64"),
    (["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_first_token_weight=-1"],
     "actor_rollout_ref.actor.kl_loss_first_token_weight", "must be >= 0"),
    (["actor_rollout_ref.actor.kl_loss_first_token_weight=20"], "actor_rollout_ref.actor.kl_loss_first_token_weight",
     "applies only with actor_rollout_ref.actor.use_kl_loss=true"),
    (["algorithm.gamma=1.5"], "algorithm.gamma", "must be in [0, 1]"),
    (["algorithm.lam=-0.1"], "algorithm.lam", "must be in [0, 1]"),
    (["actor_rollout_ref.actor.grad_clip=0"], "actor_rollout_ref.actor.grad_clip", "must be > 0"),
    (["actor_rollout_ref.actor.grad_clip=-1"], "actor_rollout_ref.actor.grad_clip", "must be > 0"),
    (["actor_rollout_ref.actor.attn_implementation=flash"], "actor_rollout_ref.actor.attn_implementation", "must be one of auto, eager, sdpa"),
    (["actor_rollout_ref.rollout.dtype=float8"], "actor_rollout_ref.rollout.dtype", "must be one of auto, bfloat16, float32"),
    (["env.name=doctor", "env.llm.dtype=fp16"], "env.llm.dtype", "must be one of auto, bfloat16, float32"),
    (["trainer.logger=[console,tensorbord]"], "trainer.logger", "unknown tracker(s) ['tensorbord']"),
    (["trainer.resume_mode=sometimes"], "trainer.resume_mode", "must be auto (the latest checkpoint, if any), disable"),
    (["env.name=chess"], "env.name", f"is not a built-in environment ({', '.join(builtin_env_names())})"),
    (["env.name=search", "env.options={topk: 3, colour: red}"], "env.options", "['colour'] are not options of SearchEnv"),
    (["env.name=search", "env.options={topk: 0}"], "env.options", "topk"),
    (["env.name=mine", "env.path=/nonexistent/my_env.py", "env.class_name=Mine"], "env.path", "no such file"),
    (["algorithm.adv_estimator=gae", "critic.enable=false"], "critic.enable", "needs a critic's values"),
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "compares the samples of each prompt: set rollout.n >= 2"),
    (["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "rollout.n >= 2"),
    (["custom_reward_function.timeout_s=0"], "custom_reward_function.timeout_s", "must be > 0"),
    (["actor_rollout_ref.model.path=/nonexistent/model"], "actor_rollout_ref.model.path", "neither a built-in model"),
    (["data.train_files=[/nonexistent/train.parquet]"], "data.train_files", "no such file"),
    (["data.val_files=[/nonexistent/test.parquet]"], "data.val_files", "no such file"),
    (["data.train_files=[{tmp}]"], "data.train_files", "is a directory; name the file(s) in it"),
    (["actor_rollout_ref.actor.optim.betas=[0.9, 1.5]"], "actor_rollout_ref.actor.optim.betas", "two numbers in [0, 1)"),
    (["actor_rollout_ref.actor.optim.lr_scheduler=linear"], "actor_rollout_ref.actor.optim.lr_scheduler", "use one of constant, cosine"),
    (["actor_rollout_ref.actor.dtype=float16"], "actor_rollout_ref.actor.dtype", "use one of auto, float32, bfloat16"),
    (["trainer.device=tpu"], "trainer.device", "use one of auto, cpu, cuda"),
    (["actor_rollout_ref.model.lora_rank=-4"], "actor_rollout_ref.model.lora_rank", "must be >= 0"),
    (["actor_rollout_ref.actor.optim.min_lr_ratio=2"], "actor_rollout_ref.actor.optim.min_lr_ratio", "must be in [0, 1]"),
    (["reward_model.enable=true"], "reward_model.model_path", "required with reward_model.enable=true"),
    (["trainer.save_freq=0"], "trainer.save_freq", "must be -1 (save at the end only) or >= 1"),
    (["actor_rollout_ref.rollout.gpu_memory_utilization=1.2"], "actor_rollout_ref.rollout.gpu_memory_utilization", "must be in (0, 1]"),
    (["custom_reward_function.path=/nonexistent/reward.py"], "custom_reward_function.path", "no such file"),
    (["trainer.cpus_per_worker=0"], "trainer.cpus_per_worker", "must be >= 1, or null"),
    (["env.retriever.timeout_s=0"], "env.retriever.timeout_s", "must be > 0 seconds"),
    (["trainer.call_timeout_s=0"], "trainer.call_timeout_s", "must be > 0 seconds"),
    (["env.llm.cpu_kv_cache_gb=-1"], "env.llm.cpu_kv_cache_gb", "must be > 0"),
    (["env.llm.url=localhost:8000"], "env.llm.url", "must start with http:// or https://"),
    (["actor_rollout_ref.rollout.top_k=-5"], "actor_rollout_ref.rollout.top_k", "must be -1 or 0 (no top-k cut) or >= 1"),
    (["trainer.max_restarts=-1"], "trainer.max_restarts", "must be >= 0"),
    (["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"],
     "actor_rollout_ref.rollout.n", "dynamic sampling (algorithm.filter_groups.enable) compares the samples of each prompt"),
    (["algorithm.filter_groups.kl_groups=-1"], "algorithm.filter_groups.kl_groups", "must be >= 0"),
    (["algorithm.filter_groups.kl_groups=4", "actor_rollout_ref.actor.use_kl_loss=true"], "algorithm.filter_groups.kl_groups",
     "set algorithm.filter_groups.enable=true"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.kl_groups=4"], "algorithm.filter_groups.kl_groups",
     "set actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef > 0"),
    ([*KL_GROUPS, "actor_rollout_ref.actor.kl_loss_coef=0"],
     "algorithm.filter_groups.kl_groups", "set actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef > 0"),
    ([*KL_GROUPS, "algorithm.adv_estimator=reinforce_plus_plus_baseline"],
     "algorithm.filter_groups.kl_groups", "does not take each group's advantage from its own scores alone"),
    ([*KL_GROUPS, "env.reward_norm=batch"], "algorithm.filter_groups.kl_groups",
     "env.reward_norm=batch would count in the batch's mean and spread"),
    ([*KL_GROUPS, "env.filter_groups_quantile=0.5"], "algorithm.filter_groups.kl_groups",
     "env.filter_groups_quantile drops again"),
    (["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=remax"], "algorithm.filter_groups.enable",
     "greedy baseline is scored for the step's first prompts, not for the groups dynamic sampling keeps"),
    (["algorithm.guidance.enable=true", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"],
     "actor_rollout_ref.rollout.n", "guidance (algorithm.guidance.enable) gives the reference to a group of answers with none right"),
    (["algorithm.guidance.enable=true", "trainer.mode=async", "actor_rollout_ref.rollout.name=vllm"], "algorithm.guidance.enable",
     "a reference answer has no logprobs from the engine that sampled its batch"),
    (["algorithm.guidance.enable=true", "env.name=search"], "algorithm.guidance.enable", "env.name=search plays multi-turn episodes"),
    (["algorithm.guidance.enable=true", "mixture=[{name: arith, weight: 1, data: {builtin: arithmetic}}]"], "algorithm.guidance.enable",
     "a mixture's batch is joined from its sources' pieces"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=0"], "reward_model.overlong_buffer.len",
     "must be in [1, data.max_response_length="),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=100000"], "reward_model.overlong_buffer.len",
     "must be in [1, data.max_response_length="),
    (["reward_model.overlong_buffer.enable=true", "env.name=search", "env.reward_norm=group"], "reward_model.overlong_buffer.enable",
     "the penalty is in raw reward units, and env.reward_norm=group has normalised the rewards before it"),
]


@pytest.mark.parametrize("overrides, key, fragment", WRONG, ids=[" ".join(case[0]) for case in WRONG])
def test_each_wrong_config_is_refused_naming_key_value_source_and_fix(tmp_path, overrides, key, fragment):
    overrides = [item.replace("{tmp}", str(tmp_path)) for item in overrides]
    with pytest.raises(ConfigError) as info:
        load_run_config([], overrides)
    named = [p for p in info.value.problems if p.key == key and fragment in p.message]
    assert named, f"no problem names {key} with {fragment!r}: {info.value}"
    given = dict(item.split("=", 1) for item in overrides)
    for problem in named:
        if key in given:  # a key set here: the problem says so, with the value given
            value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={given[key]}"]))["value"]  # as the loader reads it
            assert problem.source == "command line", str(problem)
            assert problem.value == value or (isinstance(value, list) and problem.value in value), str(problem)
        else:  # a key left alone, named because of another one
            assert problem.source == "default", str(problem)


def test_command_line_values_are_labelled_and_untouched_keys_say_default():
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["actor_rollout_ref.rollout.n=1", "algorithm.gamma=2"])
    report, problems = str(info.value), {p.key: p for p in info.value.problems}
    assert problems["algorithm.gamma"].source == "command line"
    # the rule broken by rollout.n=1 involves algorithm.adv_estimator, left at its default; n is named
    assert problems["actor_rollout_ref.rollout.n"].source == "command line"
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["algorithm.adv_estimator=gae", "critic.enable=false"])
    assert [p.source for p in info.value.problems] == ["command line"]
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["reward_model.enable=true"])
    (problem,) = info.value.problems
    assert (problem.key, problem.source) == ("reward_model.model_path", "default")  # a key nobody set
    assert str(problems["algorithm.gamma"]).startswith("algorithm.gamma = 2.0 (from command line): must be in [0, 1]")
    assert "\n  algorithm.gamma = 2.0 (from command line): must be in [0, 1]" in report  # one indented line each


def test_a_yaml_value_is_labelled_with_its_file(tmp_path):
    yaml = tmp_path / "run.yaml"
    yaml.write_text("algorithm:\n  lam: 3.0\n")
    with pytest.raises(ConfigError) as info:
        load_config([yaml], [])
    (problem,) = info.value.problems
    assert (problem.key, problem.source) == ("algorithm.lam", str(yaml))


def test_all_problems_at_once_type_errors_do_not_hide_value_errors():
    overrides = ["data.train_batch_size=many", "actor_rollout_ref.actor.optim.lr=0", "algorithm.gamma=-1",
                 "trainer.logger=[console,tensorbord]", "actor_rollout_ref.rollout.top_p=0"]
    with pytest.raises(ConfigError) as info:
        load_run_config([], overrides)
    keys = {p.key for p in info.value.problems}
    assert keys == {"data.train_batch_size", "actor_rollout_ref.actor.optim.lr", "algorithm.gamma", "trainer.logger",
                    "actor_rollout_ref.rollout.top_p"}
    assert str(info.value).startswith("5 problem(s) in the config:")


def test_posttrain_config_exits_2_with_one_line_per_problem(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "config", "algorithm.adv_estimator=gpro", "actor_rollout_ref.actor.optim.lr=-1",
         f"data.train_files=[{tmp_path}]"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "posttrain: 3 problem(s) in the config:"
    assert "algorithm.adv_estimator = 'gpro' (from command line): unknown advantage estimator" in lines[1]
    assert "Traceback" not in done.stderr


def test_every_preset_loads_for_each_command_that_runs_it_and_keeps_every_value_it_sets():
    """No preset is refused by a command that runs it (None: the one `posttrain config` checks it for,
    which is sft for an SFT preset), and each loaded config holds every value its YAML sets."""
    load_run_config()
    sft_presets = {name for name in preset_names() if name.endswith("_sft")}
    implied = {name: implied_command(load_config([preset_path(name)], checks=None)) for name in preset_names()}
    assert implied == {name: "sft" if name in sft_presets else "train" for name in preset_names()}
    refused, lost = {}, {}
    for name in preset_names():
        set_here = list(_leaves(OmegaConf.to_container(OmegaConf.load(preset_path(name)))))
        for command in ("sft", "eval", None) if name in sft_presets else ("train", "eval", None):
            try:
                loaded = OmegaConf.create(to_yaml(load_run_config([preset_path(name)], command=command)))
            except ConfigError as error:
                refused[name, command] = str(error)
                continue
            lost[name] = [key for key, value in set_here if OmegaConf.select(loaded, key) != value]
    assert refused == {}
    assert lost == dict.fromkeys(preset_names(), [])


def _leaves(node, prefix=""):
    """(dotted key, value) of each leaf of a YAML tree."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def test_posttrain_config_on_an_sft_preset_refuses_what_posttrain_sft_would():
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "config", "--preset", "doctor_sft", "sft.micro_batch_size_per_gpu=3", "sft.optim.lr=0"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines()[0] == "posttrain: 2 problem(s) in the config:"
    assert "sft.micro_batch_size_per_gpu = 3 (from command line): must divide the 8 transcripts each rank gets" in done.stderr
    assert "sft.optim.lr = 0.0 (from command line): must be > 0" in done.stderr


def test_posttrain_config_checks_for_the_command_for_names_or_else_the_one_the_config_implies(capsys):
    from posttrain.cli import main

    bad_sft = ["sft.micro_batch_size_per_gpu=3"]  # 16 transcripts a step do not split into micro-batches of 3
    assert main(["config", "--preset", "doctor_sft", "--for", "train", *bad_sft]) == 0  # an RL run never reads sft.*
    assert main(["config", *bad_sft]) == 2  # setting sft.* makes it an SFT config
    assert main(["config", "--for", "sft", "sft.micro_batch_size_per_gpu=4"]) == 0
    assert main(["config", "actor_rollout_ref.rollout.n=1"]) == 2  # train: GRPO needs n >= 2
    assert main(["config", "--for", "eval", "actor_rollout_ref.rollout.n=1"]) == 0
    errors = capsys.readouterr().err
    assert "sft.micro_batch_size_per_gpu = 3 (from command line)" in errors and "rollout.n >= 2" in errors


def test_group_and_critic_needs_are_judged_only_for_commands_that_train():
    # SFT and evaluation run no RL update: one sample per prompt is fine there
    for command in ("sft", "eval"):
        load_run_config([], ["actor_rollout_ref.rollout.n=1"], command=command)
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_run_config([], ["actor_rollout_ref.rollout.n=1"], command="train")


def test_the_rl_batch_arithmetic_and_the_async_rules_are_judged_only_for_commands_that_train():
    # evaluation and SFT make no RL batch: a mini-batch that does not divide it, or an async option, cannot matter there
    odd = ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.mode=async", "async.unit_groups=4"]
    for command in ("sft", "eval"):
        load_run_config([], odd, command=command)
    with pytest.raises(ConfigError) as info:
        load_run_config([], odd, command="train")
    assert {"actor_rollout_ref.actor.ppo_mini_batch_size", "async.unit_groups"} <= {p.key for p in info.value.problems}


def test_every_sft_problem_at_once():
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["sft.micro_batch_size_per_gpu=3", "sft.optim.lr=0", "sft.train_files=[/nonexistent/sft.parquet]",
                             "sft.total_training_steps=0"], command="sft")
    keys = {p.key for p in info.value.problems}
    assert keys == {"sft.micro_batch_size_per_gpu", "sft.optim.lr", "sft.train_files", "sft.total_training_steps"}


def test_env_llm_problems_name_their_own_key():
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["env.name=doctor", "env.llm.top_p=2", "env.llm.timeout_s=0", "env.llm.temperature=-1"])
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"env.llm.top_p", "env.llm.timeout_s", "env.llm.temperature"}
    assert (problems["env.llm.top_p"].value, problems["env.llm.top_p"].source) == (2.0, "command line")
    assert "must be in (0, 1]" in problems["env.llm.top_p"].message


def test_grad_clip_null_turns_clipping_off():
    config = load_run_config([], ["actor_rollout_ref.actor.grad_clip=null"])
    assert config.actor_rollout_ref.actor.grad_clip is None


def test_the_config_layer_has_no_import_circle_and_imports_nothing_above_it():
    """Every import in posttrain/config/ (inside functions too) stays in config/ or is posttrain.errors,
    which imports only the standard library, or posttrain.algos (its row of the layer table) for what an
    advantage estimator declares it needs, and none goes round in a circle."""
    package = Path(posttrain.config.__file__).parent
    graph = {}
    for path in package.glob("*.py"):
        module = "posttrain.config" if path.stem == "__init__" else f"posttrain.config.{path.stem}"
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                package = ["posttrain", "config"][:3 - node.level] if node.level else []  # a relative import, from config/
                imported.add(".".join([*package, *filter(None, [node.module])]))
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[module] = {name for name in imported if name.startswith("posttrain")}
    above = {module: sorted(name for name in names if not name.startswith("posttrain.config") and name not in ("posttrain.errors", "posttrain.algos", "posttrain.algos.registry"))
             for module, names in graph.items()}
    assert above == dict.fromkeys(graph, [])
    assert graph["posttrain.config.loader"] >= {"posttrain.config.validate"}  # the loader runs the config's rules...
    TopologicalSorter(graph).prepare()  # ...and nothing imports it back: CycleError names any circle


def test_each_config_module_imports_first_in_a_fresh_interpreter():
    for module in ("posttrain.config.validate", "posttrain.config.algorithm_checks", "posttrain.config.loader", "posttrain.config"):
        code = (f"import sys, {module}; "
                "print(sorted(m for m in sys.modules if m.startswith('posttrain.') and not m.startswith('posttrain.config')))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == "['posttrain.errors']", done.stdout + done.stderr


def test_tools_that_cannot_be_loaded_or_described_are_refused_each_with_its_reason(tmp_path):
    tools = tmp_path / "my_tools.py"
    tools.write_text("def undescribed(a, b):\n    return a * b\n")
    overrides = ["env.name=tools", f"env.tools=[{tools}:undescribed,{tools}:missing,posttrain.tools:calculator]",
                 "env.tool_parser=nope", "env.tool_timeout_s=0", "env.max_tool_calls=-1"]
    with pytest.raises(ConfigError) as info:
        load_run_config([str(preset_path("tool_grpo"))], overrides)
    messages = {(p.key, p.message) for p in info.value.problems}
    assert any(key == "env.tools" and "parameter 'a' has no type hint" in message for key, message in messages)
    assert any(key == "env.tools" and "has no function 'missing'" in message for key, message in messages)
    assert any(key == "env.tool_parser" and "hermes" in message for key, message in messages)
    assert {"env.tool_timeout_s", "env.max_tool_calls"} <= {key for key, _ in messages}
    # tools set without the tool environment are named too
    with pytest.raises(ConfigError) as info:
        load_run_config([], ["env.name=search", "env.tools=[posttrain.tools:calculator]"])
    assert any(p.key == "env.tools" and "set env.name=tools" in p.message for p in info.value.problems)


def test_every_numeric_field_of_the_service_async_and_sft_sections_refuses_a_negative_value():
    """The issue found env.llm.cpu_kv_cache_gb=-1 accepted: now no number of env.llm, env.retriever,
    async or sft takes -5 (each is refused naming its key), and a URL needs its scheme."""
    import typing

    from posttrain.config.schema import AsyncConfig, EnvLLMConfig, RetrieverConfig, SFTConfig

    hints = {cls: typing.get_type_hints(cls) for cls in (EnvLLMConfig, RetrieverConfig, AsyncConfig, SFTConfig)}
    sections = [(EnvLLMConfig, "env.llm"), (RetrieverConfig, "env.retriever"), (AsyncConfig, "async"), (SFTConfig, "sft")]
    keys = []
    for cls, prefix in sections:
        for name, hint in hints[cls].items():
            kinds = set(typing.get_args(hint)) or {hint}
            if kinds & {int, float} and bool not in kinds:
                keys.append(f"{prefix}.{name}")
    assert len(keys) >= 30 and "env.llm.cpu_kv_cache_gb" in keys and "sft.max_length" in keys
    for key in keys:
        command = "sft" if key.startswith("sft.") else "train"
        with pytest.raises(ConfigError) as info:
            load_run_config([], ["env.name=doctor", "trainer.mode=async", f"{key}=-5"], command=command)
        assert any(p.key == key for p in info.value.problems), f"{key}=-5 was not refused by its key: {info.value}"
    for key, url in (("env.llm.url", "localhost:8000"), ("env.retriever.url", "127.0.0.1:8000/search")):
        with pytest.raises(ConfigError, match="must start with http:// or https://"):
            load_run_config([], [f"{key}={url}"])
        assert get_url(load_run_config([], [f"{key}=http://{url}"]), key) == f"http://{url}"


def get_url(config, key):
    from posttrain.config.validate import get

    return get(config, key)


def test_a_shared_prompt_on_a_model_with_sliding_window_layers_is_refused(tmp_path):
    """The shared-prompt layout's mask would replace a sliding window: refused before any worker
    starts, with the switch that turns it off (which is then accepted)."""
    from transformers import MistralConfig

    MistralConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=32, sliding_window=8).save_pretrained(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_run_config([], [f"actor_rollout_ref.model.path={tmp_path}"])
    named = [p for p in info.value.problems if p.key == "actor_rollout_ref.model.share_prompt"]
    assert named and "sliding_window" in named[0].message and "set it to false" in named[0].message, str(info.value)
    try:
        load_run_config([], [f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.model.share_prompt=false"])
    except ConfigError as error:
        assert not [p for p in error.problems if "share_prompt" in p.key], str(error)


def test_a_built_in_dataset_option_its_preparer_would_refuse_is_refused_by_the_config_check():
    # found now, not when the run prepares its data (after Ray, or after a recipe's earlier stages)
    with pytest.raises(ConfigError) as info:
        load_run_config([preset_path("bfcl_grpo")], ["data.builtin_options.rl_prompt_tokens=700"])
    (problem,) = info.value.problems
    assert problem.key == "data.builtin_options" and "rl_prompt_tokens=700" in problem.message
    assert "max_prompt_tokens (now 768)" in problem.message
    # a section's key is labelled with wherever its keys were set: the preset and the command line
    assert "bfcl_grpo.yaml" in problem.source and "command line" in problem.source
    with pytest.raises(ConfigError, match="unexpected keyword argument 'max_prompt_tokenz'"):
        load_run_config([preset_path("bfcl_grpo")], ["data.builtin_options.max_prompt_tokenz=900"])
    with pytest.raises(ConfigError, match="unknown dataset; choose one of arithmetic, bfcl"):
        load_run_config([], ["data.builtin=bfcl2"])
    load_run_config([preset_path("bfcl_grpo")], ["data.builtin_options.rl_prompt_tokens=1100"])  # above the cap: fine


@pytest.mark.parametrize("preset, option, fragment", [
    ("rg_grpo", "levels=1", "a curriculum steps between at least two levels"),
    ("rg_grpo", "tasks=chain_summ", "has no task ['chain_summ']"),
    ("textarena_grpo", "test_seed=100", "overlap: the training games use seeds 0..255"),
    ("textarena_grpo", "levels=[{max_number: 4}, {max_numbr: 10}]", "levels[1]={'max_numbr': 10}: TextArena's GuessTheNumber-v0 does not take them"),
    ("arithmetic_grpo", "train_size=500", "only 300 exist with 1 digit(s)"),
    ("tool_grpo", "sft_direct_fraction=1.5", "sft_direct_fraction=1.5 must lie in [0, 1]"),
    ("doctor_grpo", "sft_questions=4", "pass 1, 2 or 3"),
    ("search_grpo", "two_hop_fraction=1.5", "two_hop_fraction=1.5: must lie in [0, 1]"),
    ("gsm8k_grpo", "limit=0", "limit=0: must be at least 1"),
    (None, "val_fraction=1.5", "val_fraction=1.5: must lie strictly between 0 and 1"),  # the doctor's cases file: no preset
])
def test_each_built_in_datasets_own_option_rules_are_refused_by_the_config_check(preset, option, fragment):
    # the rule each preparer applies to its options alone (its module's checked_options), found before anything is prepared
    doctor = [] if preset else ["data.builtin=doctor", "data.builtin_options.source_file=cases.json"]
    with pytest.raises(ConfigError) as info:
        load_run_config([preset_path(preset)] if preset else [], [*doctor, f"data.builtin_options.{option}"])
    assert [p.key for p in info.value.problems] == ["data.builtin_options"] and fragment in info.value.problems[0].message


def test_a_game_constructor_that_refuses_its_values_is_a_problem_not_a_crash():
    # ThreeCardMonte asserts num_cups >= 3 in its constructor: an AssertionError of the library's, named as the option's
    with pytest.raises(ConfigError) as info:
        load_run_config([preset_path("textarena_grpo")], ["data.builtin_options.id=ThreeCardMonte-v0", "env.options.id=ThreeCardMonte-v0",
                                                          "data.builtin_options.kwargs={num_cups: 2}", "env.options.kwargs={num_cups: 2}"])
    messages = " ".join(p.message for p in info.value.problems)
    assert "kwargs={'num_cups': 2}: TextArena's ThreeCardMonte-v0 refuses them (AssertionError" in messages


def test_a_preparers_missing_library_is_one_problem_beside_the_others(monkeypatch):
    # reasoning-gym not installed: said once, and a mistake elsewhere in the config is still reported with it
    from posttrain.errors import MissingLibraryError
    from posttrain.rewards import reasoning_gym

    def not_installed():
        raise MissingLibraryError("reasoning-gym tasks need it, and reasoning-gym is not installed; pip install reasoning-gym")
    monkeypatch.setattr(reasoning_gym, "task_names", not_installed)
    with pytest.raises(ConfigError) as info:
        load_run_config([preset_path("rg_grpo")], ["algorithm.adv_estimator=gpro"])
    keys = [p.key for p in info.value.problems]
    assert "algorithm.adv_estimator" in keys and "data.builtin_options" in keys
    assert "reasoning-gym is not installed" in next(p.message for p in info.value.problems if p.key == "data.builtin_options")


@pytest.mark.parametrize("option, fragment", [
    ("data.builtin_options.no_call_share=often", "'<' not supported between instances of 'int' and 'str'"),
    ("data.builtin_options.train_categories=[live_simple,live_multiple]", "'list' object has no attribute 'split'"),
])
def test_a_built_in_dataset_option_of_the_wrong_type_is_a_problem_not_a_crash(option, fragment):
    with pytest.raises(ConfigError) as info:
        load_run_config([preset_path("bfcl_grpo")], [option])
    assert [p.key for p in info.value.problems] == ["data.builtin_options"] and fragment in info.value.problems[0].message


def test_a_mixture_sources_built_in_dataset_options_are_checked_naming_the_source():
    sources = ["{name: right, weight: 1, data: {builtin: arithmetic}}",
               "{name: wrong, weight: 1, data: {builtin: arithmetic, builtin_options: {digitz: 2}}}"]
    with pytest.raises(ConfigError) as info:
        load_run_config([], [f"mixture=[{', '.join(sources)}]"])
    problems = {p.key: p.message for p in info.value.problems}
    assert list(problems) == ["mixture[1].data.builtin_options"] and "unexpected keyword argument 'digitz'" in problems["mixture[1].data.builtin_options"]
