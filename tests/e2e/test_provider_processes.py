"""Changing how many provider processes a program spreads its nodes over moves an onboarded stack's nodes to other
processes without touching a node (issue 21, item 5).

A node's four resources belong to the provider resource ``llmgw-shard-<k>`` of its shard (llmgw_pulumi/stack/shards.py).
With another count, many nodes land in another shard: their resources' provider reference changes. The engine
replaces a resource whose provider changed only when the new provider's DiffConfig asks for it; a
``pulumi-python`` provider resource has no config, so the resource is diffed as usual, and nothing else of it
changed. The shards no longer used are deleted: provider resources, state only. So the move needs no alias, and
this test is what says so, on real hosts: no SSH connection, no file rewritten, no agent restarted, no certificate
re-issued, every moved resource on its new shard, and an empty preview afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_pulumi.stack.shards import PROVIDER_SHARDS, SHARDS_ENV, shard_name, shard_of
from tests.conftest import stack_config
from tests.e2e.node_checks import agent_process, node_files, serials, steps_taken

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

OTHER = 4
"""The count the stack moves to from the default (one process): one the benchmark compares (LLMGW_PROVIDER_SHARDS)."""
NODE_TYPES = ("ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck")


def shards_in_state(stack: Any) -> dict[str, set[str]]:
    """node id -> the names of the provider resources its four resources reference."""
    used: dict[str, set[str]] = {}
    for r in stack.export()["resources"]:
        if r["type"].rsplit(":", 1)[-1] in NODE_TYPES:
            provider_urn = r["provider"].split("::", 3)[-1].rsplit("::", 1)[0]  # urn::id -> the URN's name
            used.setdefault(r["urn"].rsplit("::", 1)[-1], set()).add(provider_urn)
    return used


def moving_and_staying(count: int = 2) -> list[str]:
    """``count`` host names whose shard changes from PROVIDER_SHARDS to OTHER shards, then ``count`` whose shard
    stays. Named here, not taken from the lab's host indices: which indices a test gets depends on the worker and
    on the tests before it, and four of them may all stay (one run in sixteen)."""
    names = [f"shard-move-{i}" for i in range(200)]
    moving = [n for n in names if shard_of(n, PROVIDER_SHARDS) != shard_of(n, OTHER)]
    staying = [n for n in names if shard_of(n, PROVIDER_SHARDS) == shard_of(n, OTHER)]
    return moving[:count] + staying[:count]


def test_another_provider_process_count_moves_the_nodes_without_touching_one(cluster, hosts, new_stack):
    fleet = hosts(4, hostnames=moving_and_staying())
    moved = [h.hostname for h in fleet if shard_of(h.hostname, PROVIDER_SHARDS) != shard_of(h.hostname, OTHER)]
    assert len(moved) == 2, f"the fleet should hold two nodes that move and two that stay: {moved} move"
    stack = new_stack(stack_config(cluster, fleet))
    stack.env.pop(SHARDS_ENV, None)
    first = stack.up()
    assert first.ok, first.output
    ids = {h.hostname for h in fleet}
    assert cluster.control_plane.wait_for(ids, timeout=30), cluster.control_plane.events[-6:]
    before = shards_in_state(stack)
    assert before == {h.hostname: {shard_name(shard_of(h.hostname, PROVIDER_SHARDS))} for h in fleet}

    files = {h.hostname: node_files(h) for h in fleet}
    agents = {h.hostname: agent_process(h, cluster) for h in fleet}
    issued = serials(stack, fleet)
    connections = {h.hostname: h.passive_tcp_opens() for h in fleet}
    mark = len(cluster.control_plane.events)

    stack.env[SHARDS_ENV] = str(OTHER)
    move = stack.up()
    assert move.ok, move.output
    steps = steps_taken(move)
    print(f"\n{PROVIDER_SHARDS} -> {OTHER} provider processes: {move.changes}; steps other than same: {steps}; "
          f"moved nodes: {moved}")

    after = shards_in_state(stack)
    assert after == {h.hostname: {shard_name(shard_of(h.hostname, OTHER))} for h in fleet}
    assert any(after[n] != before[n] for n in moved)
    # Only provider resources come and go: a shard no node used before is created, one no node uses now is
    # deleted (state only). No node's resource has a step.
    old_shards = {shard_name(shard_of(h.hostname, PROVIDER_SHARDS)) for h in fleet}
    new_shards = {shard_name(shard_of(h.hostname, OTHER)) for h in fleet}
    expected = {**{f"pulumi-python::{k}": ["create"] for k in new_shards - old_shards},
                **{f"pulumi-python::{k}": ["delete"] for k in old_shards - new_shards}}
    assert expected, "the move changes no provider resource: nothing here would show a replacement"
    assert steps == expected, steps

    problems = [f"{h.hostname}: the move opened {h.passive_tcp_opens() - connections[h.hostname]} connection(s)"
                for h in fleet if h.passive_tcp_opens() != connections[h.hostname]]
    problems += [f"{h.hostname}: files changed" for h in fleet if node_files(h) != files[h.hostname]]
    problems += [f"{h.hostname}: the agent restarted" for h in fleet if agent_process(h, cluster) != agents[h.hostname]]
    problems += [f"{n}: certificate re-issued" for n, now in serials(stack, fleet).items() if now != issued[n]]
    problems += [f"{e.node_id}: stream {e.outcome}" for e in cluster.control_plane.events[mark:]]
    assert problems == [], "\n".join(problems) + "\n" + move.output

    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
