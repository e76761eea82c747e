"""The broker process's runtime settings: the event loop it runs on and its heap after start-up;
and how a process tells that a file it loaded (a TLS certificate, key or CA) changed.

Shared by every long-running composition root (``serve``, ``demo``, ``agent``, ``bench --e2e``,
``bench --cycle``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import ssl
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# The young generation is collected every this many net allocations: CPython's default.
# It was 10,000 (fewer collections) until full passes froze their survivors; measured then
# (``bench --soak``, 24,000 jobs at 300/s, 8,000 live): GC pause p99 46-71 ms at 10,000
# (its middle generation walked up to 120,000 objects), 2-9 ms at 700, the broker's CPU
# per job the same within noise, and loop lag p99 9-15 ms -> 1-7 ms.
GC_YOUNG_THRESHOLD = 700

# How long a thread waiting for the GIL lets the running one keep it (CPython's default is
# 5 ms). The SQLite writer's thread hands the GIL back at every statement and row, and takes
# it again after: with the event loop busy, each retake waited up to the whole interval,
# while it held the store's one write transaction, which every submission waits behind
# (the soak's profile: docs/benchmarks.md).
SWITCH_INTERVAL_S = 0.001


def settle_heap() -> None:
    """Keep the cyclic garbage collector's pauses out of the request path, once the state a
    broker starts with (nodes, jobs rebuilt from the store) is loaded.

    A full collection walks every tracked object: with 20 x 500 nodes (about 200,000
    objects) it stopped the event loop for 100-190 ms several times a minute under load, and
    every request arriving then waited (``bench --e2e``: 201 latency p99 in the hundreds of
    ms). ``gc.freeze`` moves what exists now to the permanent generation, which collections
    skip; it stays freed by reference counting when dropped (only a reference cycle among
    frozen objects would outlive ``unfreeze``, and start-up state builds none to drop).
    Later full passes are kept short the same way (``freeze_after_full_passes``).
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    freeze_after_full_passes()


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def freeze_after_full_passes() -> None:
    """After every full collection, freeze what survived it, so that the next full pass
    walks only what was promoted since, not every live job again.

    Measured (``bench --e2e --jobs 100000``): without this, a full pass over 100,000 live
    jobs (about 700,000 tracked objects) stopped the loop for up to 400 ms. CPython starts a
    full pass when the objects promoted since the last one exceed a quarter of what that
    one left; with the survivors frozen each pass walks only that quarter (and then fewer),
    so pauses stay short and about as frequent as before. Right after a full pass the young
    generations are empty (it merged them), so only objects that were reachable are frozen;
    they are still freed by reference counting when dropped. What this gives up: a
    reference cycle among frozen objects that becomes garbage later is never collected
    (``gc.get_freeze_count()`` grows with it; ``bench --soak`` reports it per window, and
    RSS must stay flat there). Installed once per process."""
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def release_heap() -> None:
    """Undo ``settle_heap``'s freezing, for a service run inside a longer-lived process (the
    benchmarks' ``serving``, under tests): frozen objects become collectable again."""
    if _freeze_survivors in gc.callbacks:
        gc.callbacks.remove(_freeze_survivors)
    gc.unfreeze()


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run the service's top coroutine on uvloop where it is installed (Linux, macOS):
    the same asyncio, with about 1.5x the HTTP throughput in ``bench --e2e``. The GIL's
    switch interval is SWITCH_INTERVAL_S while it runs."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main)
        return uvloop.run(main)
    finally:
        sys.setswitchinterval(previous)


Stamp = tuple[int, int, int] | None
"""A file's modification time, size and inode (None: absent or unreadable)."""


def file_stamp(path: str | None) -> Stamp:
    """What changes when a file is replaced or rewritten (certificates renewed in place)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def tls_reason(exc: Exception) -> str:
    """Why a certificate, key or CA file did not load, in words that hold no key material."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
