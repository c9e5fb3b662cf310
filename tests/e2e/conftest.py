"""The CLI runs of the end-to-end tests share one Ray cluster per test process (tests/conftest.py's
``on_shared_ray``): starting Ray costs each run about 8 s. Tests of what the CLI does with a Ray it
starts itself (Ctrl-C, the dashboard, the default path a new user takes) are marked ``own_ray`` and
get no address."""

import pytest


@pytest.fixture(autouse=True)
def shared_ray(request):
    if request.node.get_closest_marker("own_ray") is None:
        request.getfixturevalue("on_shared_ray")
