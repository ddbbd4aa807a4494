"""The SDK's own dynamic-provider server (`python -m pulumi.dynamic`, the process the engine starts for
`pulumi-python` resources), run as the engine runs it, on loopback, with a small engine double taking its Log calls.
The fixtures ``engine`` and ``dynamic_provider`` (tests/unit/conftest.py) start them for a test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.proto import engine_pb2_grpc, provider_pb2, provider_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


class Engine(engine_pb2_grpc.EngineServicer):
    """The engine's Log call, recorded."""

    def __init__(self) -> None:
        self.logs: list[Any] = []
        self.lock = threading.Lock()

    def Log(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.logs.append(request)
        from google.protobuf import empty_pb2
        return empty_pb2.Empty()


@contextmanager
def engine_double() -> Iterator[tuple[Engine, str]]:
    """An Engine served on loopback, and its address."""
    double = Engine()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    engine_pb2_grpc.add_EngineServicer_to_server(double, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield double, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@contextmanager
def provider_server(engine_address: str) -> Iterator[Any]:
    """The SDK's dynamic-provider server, started as the engine starts it (its address argument, its port on
    stdout), with this checkout first on its path; a client stub of it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "pulumi.dynamic", engine_address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        yield provider_pb2_grpc.ResourceProviderStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait()


def create_request(urn: str, provider: ResourceProvider, **inputs: Any) -> Any:
    """The engine's CreateRequest for a dynamic resource of ``provider`` (pickled by reference, as the SDK does)."""
    # A loop of its own, not asyncio.run: that leaves the thread without an event loop, and a later test in this
    # process that makes an Output outside one (pulumi.Config.get_secret in test_program) would fail.
    loop = asyncio.new_event_loop()
    try:
        props = loop.run_until_complete(
            rpc.serialize_properties({"__provider": serialize_provider(provider), **inputs}, {}))
    finally:
        loop.close()
    return provider_pb2.CreateRequest(urn=urn, properties=props)
