"""A worker process's memory: the RSS it reports, and the malloc setting that keeps it from hoarding."""

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import psutil
import pytest

from posttrain.controller import WorkerSpec, spawn_local
from posttrain.metrics import Kind
from posttrain.trainer.roles import Roles
from tests.controller.workers import Counter

# 64 blocks of 4 MiB, each followed by a 256 KiB one that stays (so the freed ones cannot be trimmed from
# the heap's top), after a freed 16 MiB block has raised glibc's dynamic mmap threshold above them:
# the free space the heap keeps afterwards, in MiB.
HEAP_KEPT = textwrap.dedent("""
    import ctypes, sys
    from posttrain.controller.memory import limit_heap_growth
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "limited":
        assert limit_heap_growth()
    libc.free(libc.malloc(16 << 20))
    pairs = [(libc.malloc(4 << 20), libc.malloc(256 << 10)) for _ in range(64)]
    for big, _ in pairs:
        libc.free(big)
    print(libc.mallinfo2().fordblks >> 20)
""")


def heap_kept_mib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", HEAP_KEPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_limited_heap_growth_gives_freed_tensors_back_where_glibc_would_keep_them():
    assert heap_kept_mib("default") >= 250  # the 256 MiB freed, kept by the heap
    assert heap_kept_mib("limited") < 8


# bfloat16 linear forward and backward at 100 token counts after 70 others, one thread: how much more heap
# is in use after them (MB), and whether this CPU's bfloat16 matmuls went through oneDNN's caches at all.
SHAPE_CACHE_GROWTH = textwrap.dedent("""
    import os, sys
    import torch
    from posttrain.controller.memory import heap_gb, limit_heap_growth
    if sys.argv[1] == "limited":
        limit_heap_growth()  # after torch's import, before its first bfloat16 matmul: as a worker does
    else:
        os.environ.pop("LRU_CACHE_CAPACITY", None), os.environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    torch.set_num_threads(1)
    layer = torch.nn.Linear(256, 512).to(torch.bfloat16)
    def through(tokens):
        layer(torch.randn(tokens, 256, dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    for tokens in range(1, 71):  # past the cap's 64 entries
        through(tokens)
    before = heap_gb()[0]
    for tokens in range(71, 171):
        through(tokens)
    print((heap_gb()[0] - before) * 1e3)
""")


def shape_cache_growth_mb(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", SHAPE_CACHE_GROWTH, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.may_skip
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_matmuls_of_ever_new_shapes_leave_no_heap_behind_once_the_caches_are_capped():
    unlimited = shape_cache_growth_mb("default")
    if unlimited < 20:
        pytest.skip(f"this CPU's bfloat16 matmuls kept nothing per shape ({unlimited:.1f} MB over 100 shapes): no cache to cap")
    assert unlimited >= 40  # oneDNN's caches keep what they built for each new shape (~1.7 MB each here, native bf16)
    assert shape_cache_growth_mb("limited") < 5  # full after 64 shapes: each new one evicts an old one


def test_every_worker_reports_its_process_rss():
    group = spawn_local({"c": WorkerSpec(Counter)}, world_size=2)["c"]  # local mode: both ranks are this process
    reported = group.process_memory_gb()
    rss = psutil.Process().memory_info().rss / 1e9
    assert [rank["rss_gb"] for rank in reported] == pytest.approx([rss] * 2, rel=0.05)
    assert all(rank["peak_rss_gb"] >= rank["rss_gb"] * 0.95 for rank in reported)  # a high-water mark is never below the RSS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_heap_metrics_tell_memory_in_use_from_memory_kept_free():
    """64 blocks of 4 MiB kept, then freed (the default threshold risen above them, as in HEAP_KEPT): in
    use while kept, free-but-kept after, each as heap_used_gb / heap_free_gb say."""
    code = textwrap.dedent("""
        import ctypes
        from posttrain.controller.memory import process_memory_gb
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
        libc.free(libc.malloc(16 << 20))
        before = process_memory_gb()
        pairs = [(libc.malloc(4 << 20), libc.malloc(256 << 10)) for _ in range(64)]
        held = process_memory_gb()
        for big, _ in pairs:
            libc.free(big)
        after = process_memory_gb()
        print(*(m[k] for m in (before, held, after) for k in ("heap_used_gb", "heap_free_gb")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    used0, free0, used1, free1, used2, free2 = map(float, done.stdout.split())
    assert used1 - used0 == pytest.approx(64 * (4 + 0.25) * 2**20 / 1e9, rel=0.05)  # the 272 MiB in use
    assert used1 - used2 == pytest.approx(64 * 4 * 2**20 / 1e9, rel=0.05)  # the 256 MiB freed ...
    assert free2 - free1 == pytest.approx(64 * 4 * 2**20 / 1e9, rel=0.05)  # ... and kept by the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_step_end_reading_hands_the_heap_s_free_memory_back_to_the_system():
    """256 MiB of small (64 KiB) blocks, freed but for every 64th: the heap keeps them free (the rss holds
    them); the reading a worker takes at a step's end gives their pages back, and the RSS drops by as much.
    glibc still counts them as the heap's free space (``heap_free_gb``): free, but no longer resident."""
    code = textwrap.dedent("""
        import ctypes
        from posttrain.controller.memory import process_memory_gb
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
        libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        blocks = [libc.malloc(64 << 10) for _ in range(4096)]
        for block in blocks:
            libc.memset(block, 1, 64 << 10)  # touched: resident
        for i, block in enumerate(blocks):
            if i % 64:
                libc.free(block)  # every 64th kept: the heap cannot shrink from its top alone
        kept = process_memory_gb()
        given = process_memory_gb(give_back=True)
        print(*(m[k] for m in (kept, given) for k in ("rss_gb", "heap_free_gb")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rss_kept, free_kept, rss_given, free_given = map(float, done.stdout.split())
    freed = 4032 * 64 * 2**10 / 1e9  # 0.264 GB
    assert free_kept >= 0.9 * freed  # kept by the heap, resident
    assert rss_kept - rss_given >= 0.8 * freed  # handed back: out of the RSS
    assert free_given == pytest.approx(free_kept, rel=0.05)  # still the heap's free space, its pages no longer resident


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getrusage's units differ elsewhere")
def test_the_peak_keeps_a_step_s_high_water_mark_after_the_memory_is_given_back():
    import subprocess

    code = ("import numpy as np; from posttrain.controller.memory import peak_resident_gb, resident_gb, limit_heap_growth;"
            "limit_heap_growth(); before = resident_gb(); a = np.ones(400_000_000 // 8); del a;"
            "print(before, peak_resident_gb(), resident_gb())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, peak, now = map(float, done.stdout.split())
    assert peak - before >= 0.35 and peak - now >= 0.35  # the 0.4 GB array: in the peak, given back from the RSS


class FakeGroup:
    def __init__(self, *gb: float) -> None:
        self.gb, self.calls = list(gb), 0

    def process_memory_gb(self) -> list[dict[str, float]]:
        self.calls += 1
        return [{"rss_gb": gb, "peak_rss_gb": gb + 1, "heap_free_gb": gb / 10} for gb in self.gb]


def test_each_pools_processes_report_once_as_the_largest_rank():
    actor, ref, env_llm = FakeGroup(3.0, 5.0), FakeGroup(3.0, 5.0), FakeGroup(2.0)
    pools = SimpleNamespace(roles_by_pool=lambda: {"global_pool": ["ref", "actor"], "env_llm_pool": ["env_llm"], "generator_0": ["generator_0"]})
    metrics = Roles(actor, ref, None, None, pools, env_llm).resident_memory()
    assert {name: (m.value, m.kind) for name, m in metrics.items()} == {
        "memory/policy/rss_gb": (5.0, Kind.MAX), "memory/env_llm/rss_gb": (2.0, Kind.MAX),
        "memory/policy/peak_rss_gb": (6.0, Kind.MAX), "memory/env_llm/peak_rss_gb": (3.0, Kind.MAX),
        "memory/policy/heap_free_gb": (0.5, Kind.MAX), "memory/env_llm/heap_free_gb": (0.2, Kind.MAX)}
    assert (actor.calls, ref.calls, env_llm.calls) == (1, 0, 1)  # the reference shares the policy's processes
