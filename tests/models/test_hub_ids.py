"""A Hugging Face Hub model id wherever a model path is accepted: found in huggingface_hub's cache
offline (a cache filled here by hand, as a download would leave it), with a message naming the id, the
cache and the fix when it is not there; local paths and built-in names keep their meaning."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.models import cached_tiny_model

REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo_id: str) -> Path:
    """``root`` laid out like huggingface_hub's cache holding ``repo_id`` (the tiny model) at ``main``."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(cached_tiny_model("llama"), repo / "snapshots" / REVISION)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return root


def resolve(model: str, cache: Path) -> subprocess.CompletedProcess:
    # huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when imported: a fresh process
    code = f"from posttrain.models import resolve_model; print(resolve_model({model!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})


def test_a_hub_id_resolves_from_the_cache_offline(tmp_path):
    cache = hub_cache(tmp_path / "hub", "acme/tiny-chat")
    done = resolve("acme/tiny-chat", cache)
    assert done.returncode == 0, done.stderr[-2000:]
    path = Path(done.stdout.strip())
    assert path == cache / "models--acme--tiny-chat" / "snapshots" / REVISION
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_hub_id_neither_cached_nor_reachable_says_what_to_do(tmp_path):
    done = resolve("acme/not-cached", tmp_path / "hub")
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "acme/not-cached" in message and str(tmp_path / "hub") in message and "HF_HUB_OFFLINE=1" in message
    assert "huggingface-cli download acme/not-cached" in message


def test_a_local_directory_with_a_slash_is_still_a_path(tmp_path, monkeypatch):
    from posttrain.models import resolve_model

    local = tmp_path / "runs" / "export"
    shutil.copytree(cached_tiny_model("llama"), local)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("runs/export") == local.resolve()


@pytest.mark.slow
@pytest.mark.ray
def test_training_from_a_hub_id_with_the_cache_only(tmp_path):
    """The CLI end to end: the policy and the reference model named by a Hub id, HF_HUB_OFFLINE=1."""
    from tests.e2e.test_train_cli import HF_ROLLOUT, TINY_RUN

    cache = hub_cache(tmp_path / "hub", "acme/tiny-chat")
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "actor_rollout_ref.model.path=acme/tiny-chat",
         f"trainer.default_local_dir={tmp_path / 'run'}", *TINY_RUN, "trainer.total_training_steps=1",
         "trainer.val_before_train=false", "actor_rollout_ref.actor.use_kl_loss=true",
         HF_ROLLOUT],  # each worker resolves the id to the same cached directory whichever engine it loads
        capture_output=True, text=True, timeout=600, env=os.environ | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 1 and "actor/kl_loss" in records[-1]["metrics"]
