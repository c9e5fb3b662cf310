import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def worker_runtime_env() -> dict:
    """Ray's workers import the test modules' worker classes by name, and every package this Python
    finds: its whole path, not the repository alone (a machine whose Ray comes from PYTHONPATH would
    otherwise start workers that cannot import ray)."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])}}


def start_local_ray(num_cpus: int = 4, num_gpus: int = 0) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # a new cluster, even when a `ray start` (the two-node test's) is the machine's latest
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env=worker_runtime_env(),
        )


@pytest.fixture
def ray_local():
    """A local Ray cluster with 4 logical CPUs (shared by the tests that ask for it)."""
    import ray

    start_local_ray()
    yield ray


@pytest.fixture(scope="session")
def tokenizer():
    """The SmolLM2 tokenizer (ChatML template; <|im_end|> is eos and pad) of the cached tiny model."""
    from posttrain.models import cached_tiny_model, load_tokenizer

    return load_tokenizer(cached_tiny_model("llama"))
