"""Config: YAML and dotted overrides over typed defaults; every problem reported at once."""

import subprocess
import sys

import pytest

from posttrain.config import ConfigError, load_config, to_yaml
from posttrain.config.schema import PosttrainConfig


def test_defaults_are_typed_dataclasses():
    config = load_config()
    assert isinstance(config, PosttrainConfig)
    assert config.actor_rollout_ref.rollout.n == 4
    assert config.trainer.default_local_dir == "runs/posttrain/run"  # interpolation resolved


def test_yaml_then_overrides_last_one_wins(tmp_path):
    yaml = tmp_path / "run.yaml"
    yaml.write_text("data:\n  train_batch_size: 16\n  max_prompt_length: 64\ntrainer:\n  experiment_name: exp\n")
    config = load_config([yaml], ["data.train_batch_size=32", "trainer.logger=[console,tensorboard]"])
    assert config.data.train_batch_size == 32
    assert config.data.max_prompt_length == 64
    assert config.trainer.logger == ["console", "tensorboard"]
    assert config.trainer.default_local_dir == "runs/posttrain/exp"
    assert load_config([], ["custom_reward_function.reward_kwargs.alpha=0.5"]).custom_reward_function.reward_kwargs == {"alpha": 0.5}


def test_every_problem_is_reported_together_with_key_value_source_and_fix(tmp_path):
    yaml = tmp_path / "bad.yaml"
    yaml.write_text("data:\n  train_batch_sise: 16\n")
    with pytest.raises(ConfigError) as info:
        load_config([yaml], ["data.max_prompt_length=abc", "algorithm.kl_ctrl.type=pid", "novalue"])
    problems = {p.key: p for p in info.value.problems}
    # the type error (max_prompt_length) does not hide the value error (kl_ctrl.type)
    assert set(problems) == {"data.train_batch_sise", "data.max_prompt_length", "novalue", "algorithm.kl_ctrl.type"}
    assert "did you mean data.train_batch_size" in problems["data.train_batch_sise"].message
    assert problems["data.train_batch_sise"].source == str(yaml)
    assert "expected int" in problems["data.max_prompt_length"].message
    assert "key=value" in problems["novalue"].message
    assert problems["algorithm.kl_ctrl.type"].source == "command line"
    assert "must be one of fixed, adaptive" in problems["algorithm.kl_ctrl.type"].message


def test_batch_arithmetic_names_the_numbers():
    with pytest.raises(ConfigError) as info:
        load_config([], ["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    (problem,) = info.value.problems
    assert problem.key == "actor_rollout_ref.actor.ppo_mini_batch_size"
    assert "data.train_batch_size=12" in problem.message and "set it to 6" in problem.message

    with pytest.raises(ConfigError) as info:
        load_config([], [
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=3",
            "trainer.n_workers_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.enable=false",
        ])
    (problem,) = info.value.problems
    # 4 prompts x 3 = 12 samples over 2 ranks = 6 per rank, which micro-batches of 4 do not divide
    assert "6 samples each rank" in problem.message and "set it to 3" in problem.message

    with pytest.raises(ConfigError, match="do not split over 5 rank"):
        load_config([], ["trainer.n_workers_per_node=5"])
    # the critic's sizes are checked only when a critic runs (gae needs one)
    load_config([], ["critic.ppo_mini_batch_size=3"])
    with pytest.raises(ConfigError, match="critic.ppo_mini_batch_size"):
        load_config([], ["critic.ppo_mini_batch_size=3", "algorithm.adv_estimator=gae"])


def test_unparsable_values_and_broken_yaml_are_collected(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config([broken], ["data.train_batch_size=[1,"])
    assert [p.key for p in info.value.problems] == ["config file", "data.train_batch_size"]
    assert load_config([], ["data.val_batch_size=${data.train_batch_size}"]).data.val_batch_size == 8


def test_non_positive_sizes_are_refused():
    with pytest.raises(ConfigError, match="rollout.n = 0 .*must be >= 1"):
        load_config([], ["actor_rollout_ref.rollout.n=0"])


def test_yaml_round_trip():
    config = load_config([], ["data.train_batch_size=16"])
    text = to_yaml(config)
    assert "train_batch_size: 16" in text


def test_cli_config_prints_yaml_and_fails_cleanly_on_bad_keys():
    ok = subprocess.run([sys.executable, "-m", "posttrain.cli", "config", "data.train_batch_size=16"], capture_output=True, text=True)
    assert ok.returncode == 0 and "train_batch_size: 16" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "posttrain.cli", "config", "data.bogus=1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "data.bogus" in bad.stderr and "Traceback" not in bad.stderr


def test_multi_turn_settings_that_cannot_work_together_are_named():
    with pytest.raises(ConfigError) as info:
        load_config([], [
            "env.name=search", "env.max_turn_tokens=200", "data.max_response_length=128", "env.turns_range=[3,1]",
            "env.filter_groups_quantile=1.0", "env.observation_role=system", "reward_model.enable=true",
            "algorithm.adv_estimator=remax", "env.reward_norm=group",
        ])
    message = str(info.value)
    for expected in ("env.max_turn_tokens = 200", "data.max_response_length=128", "env.turns_range = [3, 1]",
                     "env.filter_groups_quantile = 1.0", "env.observation_role = 'system'", "reward_model.enable",
                     "adv_estimator=remax subtracts"):
        assert expected in message
    assert load_config([], ["env.name=search"]).env.max_turns == 4  # the defaults are consistent


def test_env_llm_settings_are_checked_before_any_worker():
    from posttrain.cli.preflight import load_run_config

    with pytest.raises(ConfigError) as info:
        load_run_config([], [
            "env.name=doctor", "env.llm.placement=elsewhere", "env.llm.rollout=tgi", "env.llm.max_tokens=64",
            "env.llm.max_model_len=64", "env.llm.temperature=-1", "env.llm.cpus=0",
        ])
    message = str(info.value)
    for expected in ("env.llm.placement = 'elsewhere'", "env.llm.rollout = 'tgi'", "must exceed env.llm.max_tokens=64",
                     "env.llm.temperature = -1", "env.llm.cpus = 0"):
        assert expected in message
    assert load_config([], ["env.name=doctor"]).env.llm.placement == "colocate"


def test_sft_section_is_checked_by_the_sft_run_only():
    from posttrain.config.validate import check_sft

    config = load_config([], ["sft.train_batch_size=12", "sft.micro_batch_size_per_gpu=8", "trainer.n_workers_per_node=3",
                              "data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6"])
    (problem,) = check_sft(config)  # an RL run with this layout loads fine
    assert problem.key == "sft.micro_batch_size_per_gpu" and "4 transcripts each rank" in problem.message and "set it to 4" in problem.message
    with pytest.raises(ConfigError) as info:
        load_config([], ["sft.truncation=middle", "sft.max_length=0"])
    assert {p.key for p in info.value.problems} == {"sft.truncation", "sft.max_length"}
    assert check_sft(load_config([], ["sft.train_batch_size=15", "trainer.n_workers_per_node=2", "critic.enable=false"]))[0].key == "sft.train_batch_size"


def test_the_separate_old_logprob_pass_is_skipped_only_for_a_single_update_step():
    from posttrain.trainer.learn import single_update_step

    single = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    assert single_update_step(load_config([], single))
    assert not single_update_step(load_config([], single + ["actor_rollout_ref.actor.ppo_epochs=2"]))
    assert not single_update_step(load_config([], ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]))
    assert not single_update_step(load_config([], single + ["algorithm.use_kl_in_reward=true"]))


def test_async_settings_that_cannot_work_are_refused_before_start():
    with pytest.raises(ConfigError) as info:
        load_config([], [
            "trainer.mode=async", "async.max_staleness=-1", "async.num_generators=0", "async.buffer_size=4",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "async.unit_groups=3",
            "algorithm.adv_estimator=remax", "async.correction=vtrace", "async.partial_rollout=abort",
        ])
    message = str(info.value)
    for expected in ("async.max_staleness = -1", "async.num_generators = 0", "async.buffer_size = 4", "must hold at least one batch",
                     "async.unit_groups = 3", "(from trainer.mode=async): it needs a greedy baseline", "async.correction = 'vtrace'",
                     "async.partial_rollout = 'abort'"):
        assert expected in message, expected
    config = load_config([], ["trainer.mode=async", "async.max_staleness=2"])  # both spellings reach one section
    assert config.async_.max_staleness == 2 and "async:" in to_yaml(config) and "async_" not in to_yaml(config)
    with pytest.raises(ConfigError, match="async.max_staleness = -1"):  # a value no run can use is refused in sync mode too
        load_config([], ["trainer.mode=sync", "async.max_staleness=-1"])


def test_loss_scale_factor_is_verls_seq_mean_token_sum_norm_divisor_only():
    sum_norm = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"
    assert load_config([], [sum_norm, "actor_rollout_ref.actor.loss_scale_factor=512"]).actor_rollout_ref.actor.loss_scale_factor == 512
    assert load_config().actor_rollout_ref.actor.loss_scale_factor is None
    for overrides, expected in (
        (["actor_rollout_ref.actor.loss_scale_factor=512"], "applies only to actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"),
        ([sum_norm, "actor_rollout_ref.actor.loss_scale_factor=0"], "must be >= 1"),
    ):
        with pytest.raises(ConfigError) as info:
            load_config([], overrides)
        assert "actor_rollout_ref.actor.loss_scale_factor" in str(info.value) and expected in str(info.value)
