"""The Env-LLM worker on Ray with a tiny model: built by the run's role layout (colocated with the policy
or in a pool of its own), answering a batch of conversations through the client environments use."""

import pytest

from posttrain.config.loader import load_config, preset_path
from posttrain.models import cached_tiny_model
from posttrain.rollout.env_llm import needs_env_llm_worker, open_env_llm
from posttrain.trainer.roles import resource_pools, start_roles

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def doctor_config(placement: str, **extra):
    tiny = str(cached_tiny_model("llama"))
    overrides = [
        f"actor_rollout_ref.model.path={tiny}", f"env.llm.model_path={tiny}", f"env.llm.placement={placement}",
        "env.llm.max_tokens=8", "env.llm.max_model_len=256", "env.llm.cpu_kv_cache_gb=0.0625",
        "actor_rollout_ref.rollout.cpu_kv_cache_gb=0.0625", "data.max_prompt_length=64", "data.max_response_length=64",
        "actor_rollout_ref.rollout.name=hf",  # the policy's engine is not the point: the patient's (vLLM) is
        *[f"{key}={value}" for key, value in extra.items()],
    ]
    return load_config([preset_path("doctor_grpo")], overrides)


def host_pid(group):
    import ray

    return ray.get(group._backend.actors[0].pid.remote())


def test_the_worker_is_built_only_when_the_environment_asks_for_it():
    assert needs_env_llm_worker(doctor_config("colocate"))
    assert not needs_env_llm_worker(doctor_config("colocate", **{"env.options.patient": "rule"}))
    assert not needs_env_llm_worker(doctor_config("colocate", **{"env.llm.url": "http://127.0.0.1:8000/v1"}))
    separate = resource_pools(doctor_config("separate"), ["env_llm", "actor"])
    assert separate.role_to_pool == {"env_llm": "env_llm_pool", "actor": "global_pool"}
    assert separate.pools["env_llm_pool"].cpus_per_bundle == 1
    assert list(resource_pools(doctor_config("colocate"), ["env_llm", "actor"]).pools) == ["global_pool"]


@pytest.mark.parametrize("placement", ["colocate", "separate"])
def test_env_llm_worker_answers_a_batch(placement):
    from tests.conftest import start_local_ray

    start_local_ray()
    config = doctor_config(placement)
    roles = start_roles(config, total_steps=1)
    try:
        assert roles.env_llm is not None
        same_process = host_pid(roles.env_llm) == host_pid(roles.actor)
        assert same_process == (placement == "colocate")
        client = open_env_llm(config.env.llm, roles.env_llm)
        conversations = [[{"role": "system", "content": "You are a patient."}, {"role": "user", "content": f"Question {i}?"}]
                         for i in range(5)]
        replies = client.chat(conversations)
        assert len(replies) == 5 and all(isinstance(r.text, str) for r in replies)
        assert all(r.finish_reason in ("stop", "length") and 1 <= r.completion_tokens <= 8 for r in replies)
        # greedy by default: the same conversation gets the same reply
        assert [r.text for r in client.chat(conversations[:2])] == [r.text for r in replies[:2]]
        # a conversation longer than the context loses its oldest turns instead of failing
        long = [{"role": "system", "content": "You are a patient."}] + [
            {"role": role, "content": "word " * 40} for _ in range(6) for role in ("user", "assistant")
        ] + [{"role": "user", "content": "Last question?"}]
        (reply,) = client.chat([long])
        assert reply.prompt_tokens <= 256 - 8
        metrics = client.drain_metrics()
        assert metrics["env_llm/requests"].value == 3 and metrics["env_llm/replies"].value == 8 and metrics["env_llm/wait_s"].value > 0
    finally:
        roles.release()


def test_hf_generate_fallback_in_local_mode():
    """The same worker class with HF generate (env.llm.rollout=hf), in the controller's process (no Ray)."""
    from posttrain import keys
    from posttrain.config.schema import EnvLLMConfig
    from posttrain.controller import WorkerSpec, spawn_local
    from posttrain.protocol import Batch
    from posttrain.workers.env_llm import EnvLLMWorker

    config = EnvLLMConfig(model_path=str(cached_tiny_model("llama")), rollout="hf", max_tokens=6, max_model_len=128)
    group = spawn_local({"env_llm": WorkerSpec(EnvLLMWorker, (config,))})["env_llm"]
    chats = [[{"role": "user", "content": f"Do you have a fever, {name}?"}] for name in ("Ann", "Bo", "Cy")]
    reply = group.chat(Batch.from_dict(non_tensors={keys.ENV_LLM_MESSAGES: chats}))
    assert len(reply[keys.ENV_LLM_REPLY]) == 3 and all(isinstance(text, str) for text in reply[keys.ENV_LLM_REPLY])
    assert all(1 <= n <= 6 for n in reply[keys.ENV_LLM_COMPLETION_TOKENS])
    again = group.chat(Batch.from_dict(non_tensors={keys.ENV_LLM_MESSAGES: chats[:1]}))
    assert again[keys.ENV_LLM_REPLY][0] == reply[keys.ENV_LLM_REPLY][0]  # greedy


def test_a_reply_cache_replays_the_workers_replies_in_any_batch_order(tmp_path):
    """env.llm.reply_cache through open_env_llm: a second client (a later evaluation) on the same file gets
    the stored replies, sampled at temperature 1, and asks the worker only for the conversation it lacks."""
    from dataclasses import replace

    from posttrain.config.schema import EnvLLMConfig
    from posttrain.controller import WorkerSpec, spawn_local
    from posttrain.workers.env_llm import EnvLLMWorker

    config = EnvLLMConfig(model_path=str(cached_tiny_model("llama")), rollout="hf", max_tokens=6, max_model_len=128,
                          temperature=1.0, reply_cache=str(tmp_path / "replies.sqlite"))
    group = spawn_local({"env_llm": WorkerSpec(EnvLLMWorker, (config,))})["env_llm"]
    chats = [[{"role": "user", "content": f"Do you have a fever, {name}?"}] for name in ("Ann", "Bo", "Cy", "Di")]
    first = open_env_llm(config, group)
    replies = first.chat(chats[:3])
    assert first.drain_metrics()["env_llm/cached_replies"].value == 0
    first.close()
    later = open_env_llm(config, group)
    again = later.chat([chats[2], chats[3], chats[0], chats[1]])
    assert [again[2], again[3], again[0]] == replies
    metrics = later.drain_metrics()
    assert metrics["env_llm/cached_replies"].value == 3 and metrics["env_llm/replies"].value == 4 and metrics["env_llm/requests"].value == 1
    later.close()
    # Another sampling setting is another patient: nothing replays.
    hotter = open_env_llm(replace(config, temperature=0.9), group)
    hotter.chat(chats[:1])
    assert hotter.drain_metrics()["env_llm/cached_replies"].value == 0
    hotter.close()
