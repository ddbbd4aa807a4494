"""Fixtures shared by the unit tests' modules (each module's own fixtures stay in it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pulumi
import pytest

from lab import pki as labpki
from llmgw_pulumi.ssh import sessions
from tests.fakenode import FakeNode, FakeNodes
from tests.unit import Mocks, dynamic_server
from tests.unit.fake_node_resources import ADDR, HOST_KEY, agent_binary
from tests.unit.mock_monitor import RecordingMonitor
from tests.unit.ssh_server import Server, ed25519_pair


@pytest.fixture
def monitor() -> RecordingMonitor:
    """The SDK's mocks installed for this test, with a monitor that records every resource registered."""
    m = RecordingMonitor()
    pulumi.runtime.set_mocks(Mocks(), preview=False, monitor=m)
    return m


@pytest.fixture
def node(tmp_path: Path) -> Iterator[FakeNode]:
    """A fake node, gpu-01 at ADDR with HOST_KEY (tests/unit/fake_node_resources.py), that the providers reach."""
    fake = FakeNode(tmp_path / "node", hostname="gpu-01", host_key=HOST_KEY)
    with sessions.use(FakeNodes({ADDR: fake})):
        yield fake


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    """A cluster CA in a temporary PKI directory, as `llmgw ctl cert init-ca` makes one."""
    labpki.init_ca(tmp_path / "pki")
    return tmp_path / "pki"


@pytest.fixture
def agent_node(node: FakeNode) -> FakeNode:
    """A node whose identity is installed (AgentInstall depends on NodeIdentity): /etc/llmgw exists."""
    node.path("/etc/llmgw").mkdir(mode=0o755)
    return node


@pytest.fixture
def dev_build(tmp_path: Path) -> Path:
    """A local build of the agent (a stand-in that answers --version and comes up)."""
    path = tmp_path / "llmgw"
    path.write_bytes(agent_binary("v1.2.3-4-gabcdef"))
    return path


@pytest.fixture
def server() -> Iterator[Server]:
    """An SSH server on loopback with a new ed25519 host key, accepting one new ed25519 client key."""
    host_key, _ = ed25519_pair()
    client_key, client_text = ed25519_pair()
    yield from Server(host_key, client_key, client_text).serve()


@pytest.fixture
def engine() -> Iterator[tuple[dynamic_server.Engine, str]]:
    """An engine double on loopback that records its Log calls (tests/unit/dynamic_server.py), and its address."""
    with dynamic_server.engine_double() as served:
        yield served


@pytest.fixture
def dynamic_provider(engine: tuple[dynamic_server.Engine, str]) -> Iterator[object]:
    """A stub of the SDK's dynamic-provider server, started as the engine starts it, reporting to ``engine``."""
    with dynamic_server.provider_server(engine[1]) as stub:
        yield stub
