"""A release fetched on the operator's side (`fetch: operator`) is streamed, never held whole in memory (issue 36,
item 7; review N9).

The whole path, with real parts: AgentInstall downloads the release over real TLS from a server on loopback
(hashing it on the way into the cache), then pushes it to a node (tests/fakenode.py runs the real
install-agent.sh, fed the way the SSH session feeds it). tracemalloc's peak over the whole create stays far
below the size of the release, which the node does receive whole and install.
"""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.release_server import publish_release
from llmgw_pulumi.providers.agent import AgentInstallProvider
from tests.fakenode import FakeNode
from tests.unit.fake_node_resources import agent_inputs
from tests.unit.https_release_server import https_server

TAG = "v1.2.3"
SIZE = 64 << 20
BOUND = 8 << 20
"""What the provider may hold at its peak while it downloads and pushes a SIZE release: an eighth of it."""


def big_release() -> bytes:
    """A stand-in llmgw of SIZE bytes: a script that answers --version and starts, then a comment to fill it."""
    head = (f"#!/bin/sh\ncase $1 in --version) echo 'llmgw version {TAG}' ;; esac\nexit 0\n#").encode()
    return head + b"x" * (SIZE - len(head) - 1) + b"\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(base URL, agent.releaseCa, the amd64 binary's sha256) of an HTTPS release server on loopback serving TAG."""
    root = tmp_path / "root"
    binary = big_release()
    publish_release(root, TAG, {"amd64": binary})
    digest = hashlib.sha256(binary).hexdigest()
    del binary
    with https_server(tmp_path, root) as (url, ca):
        yield url, ca, digest


@pytest.mark.timeout(300)
def test_a_release_fetched_here_is_streamed_to_the_node_in_bounded_memory(
        agent_node: FakeNode, served: tuple[str, str, str], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, ca, digest = served
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inputs = agent_inputs(version=TAG, release_url=url, release_sha256={"amd64": digest}, release_ca=ca,
                          fetch="operator")
    tracemalloc.start()
    try:
        outs = AgentInstallProvider().create(inputs).outs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outs["installed_sha256"] == digest
    installed = agent_node.path("/usr/local/bin/llmgw")
    assert installed.stat().st_size == SIZE and agent_node.calls("curl") == []  # pushed whole, not fetched by the node
    assert peak < BOUND, f"the provider held {peak >> 20} MiB at its peak for a {SIZE >> 20} MiB release"
