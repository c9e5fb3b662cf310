"""The CLI runs of the end-to-end tests share one Ray cluster, named to them by Ray's own
``RAY_ADDRESS`` (the CLI joins the cluster it names): starting Ray costs each run about 8 s.
Tests of what the CLI does with a Ray it starts itself (Ctrl-C, the dashboard, the default
path a new user takes) are marked ``own_ray`` and get no address."""

import os
import subprocess
import sys

import pytest

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
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"})
    address = holder.stdout.readline().strip()
    if not address:
        holder.kill()
        pytest.fail("the shared Ray cluster of the end-to-end tests did not start")
    yield address
    holder.stdin.close()
    try:
        holder.wait(timeout=60)
    except subprocess.TimeoutExpired:
        holder.kill()


@pytest.fixture(autouse=True)
def shared_ray(request, monkeypatch):
    if request.node.get_closest_marker("own_ray") is None:
        monkeypatch.setenv("RAY_ADDRESS", request.getfixturevalue("shared_ray_address"))
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token to hand around
