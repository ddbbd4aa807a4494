"""One provider process serves every call the engine sends at once (llmgw_pulumi/providers/_server.py).

The SDK's dynamic-provider server runs here as under the CLI (tests/unit/dynamic_server.py). Its pool has 4
workers; the package's first call raises that. Each create below waits until CALLS creates are under way in the
process at once, or gives up after a while: with the SDK's 4 workers the fifth is queued behind the first four,
which then give up, and the test sees the most that were ever under way.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures
from typing import Any

from pulumi.dynamic import CreateResult, ResourceProvider

from llmgw_pulumi.providers import _server, base
from tests.unit import dynamic_server

CALLS = 12
"""Creates sent at once: more than the SDK's 4 workers, as `pulumi up --parallel 12` would."""
GIVE_UP = 5.0
"""How long a create waits for the others (s)."""


class GatheringProvider(ResourceProvider):
    """A create that waits for CALLS creates to be under way in this process at once, and says how many were."""

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        with _gathering:
            _gathering.under_way += 1
            _gathering.most = max(_gathering.most, _gathering.under_way)
            _gathering.wait_for(lambda: _gathering.most >= CALLS, timeout=GIVE_UP)
            _gathering.notify_all()
            most = _gathering.most
            _gathering.under_way -= 1
        return CreateResult(props["name"], {"most_under_way": most, "pid": os.getpid()})


class _Gathering(threading.Condition):
    under_way = 0
    most = 0


_gathering = _Gathering()


def test_one_provider_process_serves_every_call_at_once(dynamic_provider):
    urn = "urn:pulumi:prod::llmgw::pulumi-python:dynamic/llmgw:AgentInstall::gpu-{:02d}"
    started = time.monotonic()
    with futures.ThreadPoolExecutor(max_workers=CALLS) as engine:
        calls = [engine.submit(dynamic_provider.Create,
                               dynamic_server.create_request(urn.format(i), GatheringProvider(), name=f"gpu-{i:02d}"),
                               timeout=60) for i in range(CALLS)]
        answers = [c.result() for c in calls]
    seconds = time.monotonic() - started
    most = [a.properties["most_under_way"] for a in answers]
    assert len({a.properties["pid"] for a in answers}) == 1  # one process answered them all
    assert max(most) == CALLS, f"at most {max(most)} of {CALLS} creates were under way at once"
    assert seconds < GIVE_UP, f"{seconds:.1f}s: some creates waited for others to give up"


def test_outside_a_provider_call_no_pool_is_changed():
    """The program, or a unit test's own thread, is no executor's worker: nothing is raised there."""
    assert _server._serving_pool() is None
    with futures.ThreadPoolExecutor(max_workers=2) as pool:
        assert pool.submit(_server._serving_pool).result() is pool  # a worker finds its own executor
    assert pool._max_workers == 2
