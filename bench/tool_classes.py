"""What one episode's instance of a tool class costs (posttrain/tools/instances.py), against the obvious
alternative, a fresh ``spawn``ed interpreter per episode (as the toolbox's function process starts).

    .venv/bin/python -m bench.tool_classes [--episodes 64]

Prints, for a batch of ``--episodes`` episodes of a small class: the seconds to start each episode
(fork from the host + the class's reset) over the seconds to start one spawned interpreter that
imports the same modules (measured on 4), their ratio; the memory each episode's process holds of
its own (USS) beside the host's resident memory; one round of a call per episode; releasing them all.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from posttrain.tools.instances import InstancePool
from posttrain.tools.load import load_tools

CLASS = textwrap.dedent('''
    class Counter:
        def reset(self, start: int) -> str:
            self.value = start
            return f"starts at {start}"

        def add(self, amount: int) -> int:
            """Add to the counter.

            Args:
                amount: How much.
            """
            self.value += amount
            return self.value
''')


def _imports_tools() -> None:
    import posttrain.tools.instances  # noqa: F401 - what the host imports, paid by a spawned process too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    episodes = parser.parse_args().episodes
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "counter.py").write_text(CLASS)
        (tool,) = load_tools([f"{folder}/counter.py:Counter"])
        pool = InstancePool([tool.tool_class], timeout_s=30)
        start = time.monotonic()
        pool.open({"start": 0})
        host_s = time.monotonic() - start
        start = time.monotonic()
        keys = [pool.open({"start": i})[0] for i in range(episodes)]
        open_s = (time.monotonic() - start) / episodes
        host = psutil.Process(pool._process.pid)
        own = sorted(child.memory_full_info().uss for child in host.children())
        start = time.monotonic()
        added = pool.call([(key, 0, "add", {"amount": 1}) for key in keys])
        call_s = time.monotonic() - start
        assert [outcome.value for outcome in added] == [str(i + 1) for i in range(episodes)]
        start = time.monotonic()
        for key in keys:
            pool.release(key)
        release_s = time.monotonic() - start
        host_mb = host.memory_info().rss / 2**20
        pool.close()
    context = multiprocessing.get_context("spawn")
    start = time.monotonic()
    for _ in range(4):
        process = context.Process(target=_imports_tools)
        process.start()
        process.join()
    spawn_s = (time.monotonic() - start) / 4
    print(f"host start + first episode  {host_s:.2f} s (once per toolbox); host resident {host_mb:.0f} MB")
    print(f"start an episode            {open_s * 1000:.1f} ms (fork + reset); its own memory {own[len(own) // 2] / 2**20:.1f} MB (median USS)")
    print(f"spawn an interpreter        {spawn_s * 1000:.0f} ms (importing what the host imports)")
    print(f"ratio spawn / episode       {spawn_s / open_s:.0f}x")
    print(f"{episodes} calls, one round     {call_s * 1000:.0f} ms;  {episodes} releases {release_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
