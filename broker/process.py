"""The broker process's runtime settings: the event loop it runs on and its heap after start-up.

Shared by every long-running composition root (``serve``, ``demo``, ``agent``, ``bench --e2e``,
``bench --cycle``).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# The young generation is collected every this many net allocations (CPython's default is
# 700): fewer collections of a few milliseconds each under a burst of submissions.
GC_YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Keep the cyclic garbage collector's pauses out of the request path, once the state a
    broker starts with (nodes, jobs rebuilt from the store) is loaded.

    A full collection walks every tracked object: with 20 x 500 nodes (about 200,000
    objects) it stopped the event loop for 100-190 ms several times a minute under load, and
    every request arriving then waited (``bench --e2e``: 201 latency p99 in the hundreds of
    ms). ``gc.freeze`` moves what exists now to the permanent generation, which collections
    skip; it stays freed by reference counting when dropped (only a reference cycle among
    frozen objects would outlive ``unfreeze``, and start-up state builds none to drop).
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run the service's top coroutine on uvloop where it is installed (Linux, macOS):
    the same asyncio, with about 1.5x the HTTP throughput in ``bench --e2e``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
