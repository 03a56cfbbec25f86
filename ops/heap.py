"""The gateway's C heap: freed request buffers kept for the next request, not handed back.

A gateway allocates and frees megabytes per request (bodies, chunks, librdkafka's produce
buffers).  glibc's malloc returns free memory at the top of a heap to the kernel once it
exceeds a threshold it derives from the largest block freed so far (a few MiB), so the next
request's buffers come from fresh pages, each a page fault and a page zeroed: under
``benchmarks/kafka_bench.py``'s load, 70-120 faults per MB written.  Holding up to
:data:`KEEP_FREE_BYTES` of free memory per heap takes that to about 35, and the gateway's
CPU per MB down by 5-10%.  Blocks of :data:`OWN_MAPPING_BYTES` or more (the largest bodies)
still get mappings of their own, returned when freed.

Applies to this process through ``mallopt`` and to the worker processes it starts through
glibc's environment variables; does nothing on a C library without them (musl).

What is kept is per malloc arena, and a gateway has many (glibc makes up to 8 per core for
its threads: librdkafka's, the request threads): one catching-up pull reader, whose 16 MiB
answers are read in whichever request thread is free, left up to 64 MiB free in each, and a
gateway went from 80 MB to 600 MB for good (measured; 1.6 GB in a longer read).  So the free
memory is handed back every :data:`TRIM_EVERY_S` (``malloc_trim``): at worst one burst of
page faults per heap that often, nothing next to the faults it saves in between.  And the
arenas are :data:`ARENAS` at most: what a reader's answers go through is spread over fewer
heaps, each kept once (during a read of 211 MB the gateway took 350 MB instead of 620 MB,
the read as fast; writes were not slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

KEEP_FREE_BYTES = 64 * 1024 * 1024
OWN_MAPPING_BYTES = 32 * 1024 * 1024
TRIM_EVERY_S = 10.0
ARENAS = 2
_M_ARENA_MAX = -8
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Tune malloc as above; True if this C library took it.  An operator's own
    ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_MMAP_THRESHOLD_`` (applied by glibc at start) wins,
    and so does a ``MALLOC_ARENA_MAX`` of theirs."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is None:
        return False
    if "MALLOC_ARENA_MAX" not in os.environ:
        os.environ["MALLOC_ARENA_MAX"] = str(ARENAS)
        mallopt(_M_ARENA_MAX, ARENAS)
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    # worker processes (spawned) read these when their malloc starts
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(KEEP_FREE_BYTES)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(OWN_MAPPING_BYTES)
    return bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREE_BYTES)) and bool(
        mallopt(_M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)
    )


def trim_now_and_then(every_s: float = TRIM_EVERY_S) -> threading.Event | None:
    """Hand the free memory of every malloc arena back to the system every ``every_s``, in a
    daemon thread; set the event returned to stop it.  None (nothing started) on a C library
    without ``malloc_trim``."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            trim(0)

    threading.Thread(target=run, name="logbroker-malloc-trim", daemon=True).start()
    return stop
