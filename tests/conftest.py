import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.optional import in_ci

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


# holds a local cluster for as long as its stdin is open; prints the address first
HOLDER = """
import os, sys, ray
context = ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False)
print(context.address_info["gcs_address"], flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.fixture(scope="session")
def shared_ray_address():
    """One Ray cluster for the CLI runs of this test process (starting Ray costs each run about 8 s)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"})
    address = holder.stdout.readline().strip()
    if not address:
        holder.kill()
        pytest.fail("the shared Ray cluster of the tests' CLI runs did not start")
    yield address
    holder.stdin.close()
    try:
        holder.wait(timeout=60)
    except subprocess.TimeoutExpired:
        holder.kill()


@pytest.fixture
def on_shared_ray(shared_ray_address, monkeypatch):
    """The CLI runs this test starts join the shared cluster (the CLI joins the cluster that Ray's own
    ``RAY_ADDRESS`` names) instead of starting a Ray of their own."""
    monkeypatch.setenv("RAY_ADDRESS", shared_ray_address)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token to hand around


@pytest.fixture(scope="session")
def tokenizer():
    """The SmolLM2 tokenizer (ChatML template; <|im_end|> is eos and pad) of the cached tiny model."""
    from posttrain.models import cached_tiny_model, load_tokenizer

    return load_tokenizer(cached_tiny_model("llama"))


def pytest_collection_modifyitems(items):
    """The files with the most slow tests first, each file's tests in their order. pytest-xdist hands
    out whole files in this order (scripts/test.sh: ``--dist loadfile --no-loadscope-reorder``), so the
    long ones start early and the quick ones fill in at the end: neither process is left waiting while
    the other finishes a long file. (xdist's own order, the files with the most tests first, put the
    one-test end-to-end files last.)"""
    slow_tests = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_tests[item.path])  # a stable sort: each file's tests stay together


SKIPS_CI_ALLOWS = ("gpu", "may_skip")  # markers: a GPU, or what CI lacks by design
forbidden_skips: list = []


def pytest_runtest_logreport(report):
    """Under CI, remember each skipped test that should have run (in the controller, with xdist: every
    worker's reports come here)."""
    if in_ci() and report.skipped and not any(mark in report.keywords for mark in SKIPS_CI_ALLOWS):
        forbidden_skips.append(report)


def pytest_sessionfinish(session, exitstatus):
    """Under CI nothing that should run may skip (docs/testing.md): a skip without an allowed marker fails
    the run, with its reason. (tests/optional.py already fails the missing libraries and the sandbox; this
    catches any skip written elsewhere.)"""
    if forbidden_skips and not hasattr(session.config, "workerinput"):  # the controller, or a run without xdist
        reasons = Counter(report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                          for report in forbidden_skips)
        lines = [f"CI=true: {len(forbidden_skips)} test(s) skipped that must run here:"]
        lines += [f"  {count} x {reason}" for reason, count in reasons.items()]
        session.config.pluginmanager.get_plugin("terminalreporter").write_line("\n" + "\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
