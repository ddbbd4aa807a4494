"""The dynamic-provider process's gRPC server, made to answer every call the engine sends at once.

The SDK's dynamic-provider server (pulumi.dynamic.__main__) answers the
engine from a ``ThreadPoolExecutor`` of 4 workers: a fifth call waits in its
queue until one of the four ends. The engine sends up to its parallelism at
once (``pulumi up --parallel``; 4 per CPU by default, 8 on 2 CPUs), and a
create or update holds its worker for as long as the node takes (seconds:
``update-ca-certificates``, a download, the agent's settle window). So one
process used to onboard at most 4 nodes at a time, and a stack spread its
nodes over 8 processes (llmgw_pulumi.stack.shards), each started (a Python
with the SDK imported) in every preview and `up`, and a shard holding more
than its share of the engine's calls still queued them (docs/benchmark.md,
"Issue 40", measures both).

The SDK has no setting for the pool, and no hook before its server starts;
but the first call a provider serves runs in one of the pool's workers, and a
``ThreadPoolExecutor`` adds a thread for a new call while it has fewer than
its limit. ``serve_every_call()``, on the package's first call in a provider
process, raises that limit to WORKERS: from then on every call the engine
sends is served at once, and the engine's ``--parallel`` alone bounds how
many nodes change together. Threads are made only as calls need them.

It reads two private attributes of the standard library (a worker thread's
``_args``, whose first item is a weak reference to its executor, and the
executor's ``_max_workers`` and ``_work_queue``), the same from Python 3.8
to 3.14. Where one is missing, nothing changes: the process serves 4 calls at
once, as before.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref

__all__ = ["WORKERS", "serve_every_call"]

WORKERS = 256
"""The most calls one provider process serves at once: above any ``--parallel`` a stack runs with."""

_lock = threading.Lock()
_widened = False


def serve_every_call() -> bool:
    """Raise the worker limit of the thread pool serving this call to WORKERS (once per process); whether it is
    raised. Call it from a call the provider serves: elsewhere (the program, a unit test's thread) the current
    thread is no executor's worker, and nothing changes."""
    global _widened
    with _lock:
        if _widened:
            return True
        pool = _serving_pool()
        if pool is None or not isinstance(getattr(pool, "_max_workers", None), int):
            return False
        pool._max_workers = max(pool._max_workers, WORKERS)
        _widened = True
    # Calls that came while the 4 workers were busy wait in the pool's queue; the pool adds a thread only when
    # something is submitted: one empty task per call waiting gives each its thread now.
    queue = getattr(pool, "_work_queue", None)
    for _ in range(queue.qsize() if queue is not None else 0):
        pool.submit(_nothing)
    return True


def _nothing() -> None:
    """A task that only makes the pool start a thread."""


def _serving_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """The executor whose worker the current thread is, or None."""
    args = getattr(threading.current_thread(), "_args", None)
    ref = args[0] if isinstance(args, tuple) and args else None
    pool = ref() if isinstance(ref, weakref.ref) else None
    return pool if isinstance(pool, concurrent.futures.ThreadPoolExecutor) else None
