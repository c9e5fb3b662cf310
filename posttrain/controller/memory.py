"""A worker process's memory: how much it holds (logged every step), and keeping glibc from hoarding it.

Why (measured in docs/performance.md#memory-over-a-long-run, ``bench/soak_varied.py``): without it a
worker's memory grows under shapes that vary, because glibc's malloc keeps what PyTorch freed. glibc serves
an allocation of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap``, returned to the system on
``free``; smaller ones come from its heaps, which keep freed memory for reuse. The threshold starts at
128 KiB but is *dynamic*: each time a mapped block is freed, it rises to that block's size (up to
32 MiB). After the first update frees its activations, every activation of a micro-batch (a 4,096-token
micro-batch's are 9-25 MiB each) comes from the heaps, whose free space holds several GB, fragmented
by shapes that change from micro-batch to micro-batch. :func:`limit_heap_growth` fixes the threshold
(which also turns the dynamic rise off), so large tensors go back to the system when freed, as they
did before the rise. It is called once per worker process, before its engines are built.

The second cause is two caches keyed by shape. A bfloat16 matmul on CPU goes through oneDNN, and both
PyTorch's ideep layer (``LRU_CACHE_CAPACITY``) and oneDNN itself (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``)
keep what they built for each shape they saw, 1,024 entries each by default: a micro-batch of a new token
count adds entries for every linear layer's forward and backward (600 token counts through one 576 x 1,536
bfloat16 linear: +637 MB of heap in use). Under shapes that vary, the heap in use then climbs step after
step until the caches are full (the main job: +10-16 MB a step, 0.43 -> 0.86 GB over 20 steps).
:func:`limit_heap_growth` caps both at :data:`SHAPE_CACHE_CAPACITY` entries, enough for one micro-batch's
forward and backward (5 weight shapes x 3 products for a llama-like layer, repeated across layers), unless
the environment already sets them. Both are read at their first use, so this works as long as it comes
before the process's first bfloat16 matmul. float32 matmuls go through MKL and keep nothing.

What is left is the small blocks the heaps keep free for reuse (``heap_free_gb``, about 1 GB after 16
TextArena steps): not a leak, as the next step's peak does not add to it, but a step-end RSS that climbs.
Each worker hands it back at the step's end, when its memory is read (:func:`give_back_free_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import psutil

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20  # blocks of 1 MiB and more: mapped, and unmapped when freed
SHAPE_CACHES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")  # ideep's, oneDNN's (module docstring)
SHAPE_CACHE_CAPACITY = 64  # entries each; the default 1,024 holds ~0.5 GB or more
RSS_METRIC = "memory/{group}/rss_gb"
MEMORY_METRIC = "memory/{group}/{name}"  # each name of process_memory_gb() (peak_rss_gb: what a memory monitor sees mid-step)


def resident_gb() -> float:
    """This process's resident memory (RSS), in GB (10^9 bytes)."""
    return psutil.Process().memory_info().rss / 1e9


def peak_resident_gb() -> float:
    """This process's largest resident memory since it started (its high-water mark), in GB: a step's
    peak (an update's activations) shows here, where the RSS after the step has given it back."""
    import resource

    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kilobytes * (1 if sys.platform == "darwin" else 1024) / 1e9


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_gb() -> tuple[float, float] | None:
    """glibc's heaps (allocations below the mmap threshold): bytes in use and bytes free but kept, in GB;
    None off glibc or before 2.33 (no ``mallinfo2``). RSS at a step's end that is heap free is memory a
    ``malloc_trim`` would give back; heap in use that grows step after step is something that accumulates."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks / 1e9, info.fordblks / 1e9


def give_back_free_heap() -> bool:
    """Hand what glibc's heaps keep free back to the system (``malloc_trim(0)``): freed small blocks that
    the next step would reuse, but that otherwise climb in the RSS step after step under shapes that vary
    (docs/performance.md#memory-over-a-long-run). Returns whether any memory went back; False off glibc."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


def process_memory_gb(give_back: bool = False) -> dict[str, float]:
    """This process's memory, in GB, by metric name: ``rss_gb``, ``peak_rss_gb`` and, on glibc,
    ``heap_used_gb`` and ``heap_free_gb`` (:func:`heap_gb`). ``give_back``: first hand the heaps' free
    memory back (:func:`give_back_free_heap`), as a worker does at each step's end."""
    if give_back:
        give_back_free_heap()
    found = {"rss_gb": resident_gb(), "peak_rss_gb": peak_resident_gb()}
    heap = heap_gb()
    if heap is not None:
        found["heap_used_gb"], found["heap_free_gb"] = heap
    return found


def limit_heap_growth(threshold_bytes: int = MMAP_THRESHOLD_BYTES, cache_capacity: int = SHAPE_CACHE_CAPACITY) -> bool:
    """Serve allocations of ``threshold_bytes`` or more by mmap for the rest of this process, and cap the
    oneDNN caches keyed by shape at ``cache_capacity`` entries where the environment does not set them
    (module docstring). Returns whether the mmap threshold took effect (False off glibc, e.g. macOS or
    musl: nothing to do there; the caps are set everywhere)."""
    for name in SHAPE_CACHES:
        os.environ.setdefault(name, str(cache_capacity))
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallopt"):  # musl has no mallopt
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library on Linux; None elsewhere or where it cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
