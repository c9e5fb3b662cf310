"""LR schedules by hand numbers, and the config's bad-value messages."""

import math

import pytest
import torch

from posttrain.engines.training import LRMultiplier, TrainingEngineConfig, make_lr_scheduler
from posttrain.errors import InvalidSettings


def test_warmup_then_cosine_by_hand():
    # lr 1, warmup 2, total 6, floor 0.1: p = (s - 2) / 4 after warmup.
    schedule = LRMultiplier("cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    expected = [
        0.5,  # (0 + 1) / 2
        1.0,  # (1 + 1) / 2
        1.0,  # p = 0
        0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2,  # p = 1/4: 0.86820
        0.55,  # p = 1/2
        0.1 + 0.9 * (1 + math.cos(3 * math.pi / 4)) / 2,  # p = 3/4: 0.23180
        0.1,  # p = 1
        0.1,  # past the end: stays at the floor
    ]
    assert [schedule(s) for s in range(8)] == pytest.approx(expected, abs=1e-12)
    assert schedule(3) == pytest.approx(0.86820, abs=1e-5)


def test_constant_with_warmup_and_without():
    assert [LRMultiplier("constant", warmup_steps=4)(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert LRMultiplier("constant")(0) == 1.0


def test_scheduler_drives_the_optimizer_lr_and_round_trips():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=0.2)
    scheduler = make_lr_scheduler(optimizer, "cosine", warmup_steps=1, total_steps=3, min_lr_ratio=0.0)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.2, 0.2, 0.1, 0.0])  # warmup 1/1, then p = 0, 1/2, 1
    restored = make_lr_scheduler(torch.optim.AdamW([parameter], lr=0.2), "constant")
    restored.load_state_dict(scheduler.state_dict())
    assert restored.lr_lambdas[0] == scheduler.lr_lambdas[0] and restored.last_epoch == 4


def test_config_lists_every_problem_with_the_fix():
    with pytest.raises(InvalidSettings) as error:  # a ValueError, exit code 2 when shown to a user
        TrainingEngineConfig(model_path="m", lr_scheduler="cosine", strategy="zero3", dtype="float16", lr=0.0)
    problems = [(p.key, p.value) for p in error.value.problems]
    assert problems == [("strategy", "zero3"), ("dtype", "float16"), ("lr", 0.0), ("lr_scheduler", "cosine")]
    message = str(error.value)
    assert "lr_scheduler='cosine': needs total_steps" in message
    assert "strategy='zero3': use one of auto, none, ddp, fsdp" in message
    assert "dtype='float16'" in message and "lr=0.0" in message


def test_cpu_offload_needs_fsdp():
    with pytest.raises(ValueError, match="cpu_offload=True: needs strategy 'fsdp'"):
        TrainingEngineConfig(model_path="m", cpu_offload=True, strategy="ddp")
