"""The critic and the reference model run with the actor's attention kernels (``actor.attn_implementation``):
they read the same episodes, and a preset that chose sdpa for memory (TextArena's long episodes: eager's
L x L matrices took 14 GB) must not have its critic fall back to eager on CPU."""

import pytest

from posttrain.config import load_config
from posttrain.controller import WorkerContext
from posttrain.models import cached_tiny_model
from posttrain.trainer.roles import worker_specs


@pytest.mark.parametrize("kernels", ["sdpa", "eager"])
def test_the_critic_and_the_reference_use_the_actors_attention(kernels):
    config = load_config(overrides=[f"actor_rollout_ref.model.path={cached_tiny_model()}", "algorithm.adv_estimator=gae",
                                    "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.attn_implementation={kernels}"],
                         checks=None)
    specs = worker_specs(config, total_steps=2)
    for role in ("critic", "ref"):
        spec = specs[role]
        worker = spec.cls(WorkerContext(), *spec.args, **spec.kwargs)
        assert worker.engine.module.config._attn_implementation == kernels, role
