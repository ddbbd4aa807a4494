"""The Node component's wiring, under the SDK's mock monitor: what each resource is registered with.

The monitor records every RegisterResource request as the engine would get
it: type, name, parent, provider reference, dependencies and replaceWith.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest

from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, Node, NodeArgs
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.stack.call_stack import recorded_frames
from llmgw_pulumi.stack.shards import PROVIDER_SHARDS, SHARDS_ENV, provider_for, shard_count, shard_name, shard_of
from tests.unit import Mocks
from tests.unit.mock_monitor import NODE_TYPES, PROVIDER_TYPE, RecordingMonitor, node_args, settle

SPREAD = 8
"""A shard count the placement tests spread nodes over (LLMGW_PROVIDER_SHARDS), as a stack that sets it does."""


def ids_in_distinct_shards(n: int) -> list[str]:
    seen: dict[int, str] = {}
    i = 0
    while len(seen) < n:
        seen.setdefault(shard_of(f"gpu-{i:02d}", SPREAD), f"gpu-{i:02d}")
        i += 1
    return list(seen.values())


def same_shard_pair() -> tuple[str, str]:
    first: dict[int, str] = {}
    for i in range(100):
        node = f"vm-{i:02d}"
        if (k := shard_of(node, SPREAD)) in first:
            return first[k], node
        first[k] = node
    raise AssertionError("no two ids share a shard")


def test_shard_of_is_stable_and_spreads():
    # Pinned: a node whose shard moved gets another provider resource (state only: test_provider_processes.py).
    assert {n: shard_of(n, 8) for n in ("gpu-01", "gpu-02", "node-a", "vm-one")} == {"gpu-01": 3, "gpu-02": 3, "node-a": 1, "vm-one": 2}
    assert {shard_of(f"gpu-{i:03d}", 8) for i in range(200)} == set(range(8))
    assert shard_name(3) == "llmgw-shard-3"


def test_by_default_every_node_is_in_one_provider_process():
    """One process serves every call the engine sends at once (providers/_server.py): each more would only cost
    its start, in every preview and `up`."""
    assert PROVIDER_SHARDS == 1
    assert {shard_of(f"gpu-{i:03d}") for i in range(200)} == {0}


@pulumi.runtime.test
def test_by_default_the_nodes_share_one_provider_resource(monitor, monkeypatch):
    monkeypatch.delenv(SHARDS_ENV, raising=False)
    nodes = [Node(n, node_args(n)) for n in ("gpu-01", "node-a", "vm-one")]

    def check(_: Any) -> None:
        assert [p.name for p in monitor.of_type(PROVIDER_TYPE)] == ["llmgw-shard-0"]
        assert {r.provider.split("::")[3] for r in monitor.of_type(NODE_TYPES)} == {"llmgw-shard-0"}

    return settle(*[x.engine_check.urn for x in nodes]).apply(check)


@pulumi.runtime.test
def test_a_nodes_four_resources_run_in_its_shards_provider_process(monitor, monkeypatch):
    monkeypatch.setenv(SHARDS_ENV, str(SPREAD))
    a, b = ids_in_distinct_shards(2)
    c, d = same_shard_pair()
    nodes = [Node(n, node_args(n)) for n in (a, b, c, d)]

    def check(_: Any) -> None:
        providers = monitor.of_type(PROVIDER_TYPE)
        # One provider resource per shard in use, top-level, named as before.
        assert sorted(p.name for p in providers) == sorted({shard_name(shard_of(n, SPREAD)) for n in (a, b, c, d)})
        assert [p.parent.split("::")[-2:] for p in providers] == [["pulumi:pulumi:Stack", "project-stack"]] * len(providers)
        for n in (a, b, c, d):
            children = [r for r in monitor.of_type(NODE_TYPES) if r.name == n]
            assert len(children) == 4
            assert {r.provider.split("::")[3] for r in children} == {shard_name(shard_of(n, SPREAD))}, n

    return settle(*[x.engine_check.urn for x in nodes]).apply(check)


@pulumi.runtime.test
def test_given_providers_are_used_and_no_shard_is_made(monitor):
    mine = pulumi.ProviderResource("pulumi-python", "mine")
    node = Node("gpu-01", node_args("gpu-01"), pulumi.ResourceOptions(providers={"pulumi-python": mine}))

    def check(_: Any) -> None:
        assert [p.name for p in monitor.of_type(PROVIDER_TYPE)] == ["mine"]
        assert {r.provider.split("::")[3] for r in monitor.of_type(NODE_TYPES)} == {"mine"}

    return node.engine_check.urn.apply(check)


@pulumi.runtime.test
def test_a_node_id_known_only_later_shards_by_the_component_name(monitor, monkeypatch):
    monkeypatch.setenv(SHARDS_ENV, str(SPREAD))
    node = Node("gpu-07", node_args(pulumi.Output.from_input("gpu-07")))

    def check(_: Any) -> None:
        assert {r.provider.split("::")[3] for r in monitor.of_type(NODE_TYPES)} == {shard_name(shard_of("gpu-07", SPREAD))}

    return node.engine_check.urn.apply(check)


@pulumi.runtime.test
def test_the_vm_in_depends_on_and_replace_with_reaches_all_four_resources(monitor):
    vm = pulumi.CustomResource("command:local:Command", "vm", {"stdout": None})
    other = pulumi.CustomResource("command:local:Command", "dns", {})
    node = Node("gpu-vm", node_args("gpu-vm", host=vm.urn.apply(lambda _: "10.0.0.30")),
                pulumi.ResourceOptions(depends_on=[vm, other], replace_with=[vm]))

    def check(urns: list[str]) -> None:
        vm_urn, other_urn = urns[0], urns[1]
        children = monitor.of_type(NODE_TYPES)
        assert len(children) == 4
        for r in children:
            assert list(r.replace_with) == [vm_urn], r.type
            assert {vm_urn, other_urn} <= set(r.dependencies), r.type
        check_req = next(r for r in children if r.type.endswith("EngineCheck"))
        agent_urn = next(r for r in monitor.requests if r.type.endswith("AgentInstall")).name
        assert any(d.endswith(f"AgentInstall::{agent_urn}") for d in check_req.dependencies)

    return settle(vm.urn, other.urn, node.engine_check.urn).apply(check)


@pulumi.runtime.test
def test_a_node_without_vm_options_has_none_on_its_resources(monitor):
    node = Node("gpu-01", node_args("gpu-01"))

    def check(_: Any) -> None:
        children = monitor.of_type(NODE_TYPES)
        assert sorted(r.type.split(":")[-1] for r in children) == sorted(t.split(":")[-1] for t in NODE_TYPES), children
        for r in children:
            assert list(r.replace_with) == []
            assert not [d for d in r.dependencies if "command" in d]

    return node.engine_check.urn.apply(check)


@pulumi.runtime.test
def test_provider_for_makes_each_shard_once_per_program_run(monitor):
    a, b = same_shard_pair()
    assert provider_for(a) is provider_for(b)
    first = provider_for(a)
    pulumi.runtime.set_mocks(Mocks(), preview=False, monitor=RecordingMonitor())  # the next program run
    assert provider_for(a) is not first


@pulumi.runtime.test
def test_a_private_key_given_to_a_node_is_a_secret_input_of_each_resource_that_connects(monitor):
    from google.protobuf import json_format

    key = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nSSHKEYBODY\n"  # PEM-shaped, built at run time
    args = node_args("gpu-01")
    args.connection = ConnectionArgs(host="10.0.0.11", private_key=key)
    node = Node("gpu-01", args)

    def check(_: Any) -> None:
        connecting = [r for r in monitor.of_type(NODE_TYPES) if not r.type.endswith("ClientCertificate")]
        assert len(connecting) == 3
        for r in connecting:
            secret = json_format.MessageToDict(r.object)["connection"]["private_key"]
            assert secret["4dabf18193072939515e22adb298388d"] == "1b47061264138c4ac30d75fd1eb44270", r.type
            assert secret["value"] == key

    return node.engine_check.urn.apply(check)


def test_the_shard_count_can_be_overridden_for_a_run(monkeypatch):
    monkeypatch.delenv(SHARDS_ENV, raising=False)
    assert shard_count() == PROVIDER_SHARDS
    monkeypatch.setenv(SHARDS_ENV, "16")
    assert shard_count() == 16
    for bad in ("0", "-4", "four", "2.5"):
        monkeypatch.setenv(SHARDS_ENV, bad)
        with pytest.raises(ConfigError) as err:
            shard_count()
        assert SHARDS_ENV in str(err.value) and repr(bad) in str(err.value)


def test_a_bad_shard_count_reaches_the_program_as_a_run_error_without_a_traceback(monitor, monkeypatch):
    # The language host prints a pulumi.RunError's message alone; any other exception with its traceback.
    monkeypatch.setenv(SHARDS_ENV, "four")
    with pytest.raises(pulumi.RunError) as err:
        Node("gpu-01", node_args("gpu-01"))
    assert isinstance(err.value, ConfigError) and err.value.field == SHARDS_ENV and err.value.fix


@pulumi.runtime.test
def test_nodes_spread_over_the_overridden_shard_count(monitor, monkeypatch):
    monkeypatch.setenv(SHARDS_ENV, "16")
    ids = [f"gpu-{i:03d}" for i in range(200)]
    nodes = [Node(n, node_args(n)) for n in ids]

    def check(_: Any) -> None:
        # 200 ids over 16 shards: every shard gets some (with 8, names 8..15 would not exist).
        assert sorted(p.name for p in monitor.of_type(PROVIDER_TYPE)) == sorted(shard_name(k) for k in range(16))

    return settle(*[x.engine_check.urn for x in nodes]).apply(check)


def test_a_program_written_for_0_1_0_still_gives_the_binary_as_nodeargs_fields():
    """NodeArgs(version=..., release_url=...) as 0.1.0 took them: the same BinarySource as binary=."""
    common = {"node_id": "gpu-01", "connection": ConnectionArgs(host="10.0.0.11", private_key_path="/k"),
              "settings": AgentSettings(servers=["cp:7443"]), "pki_dir": "/pki"}
    old_style = NodeArgs(**common, version="v1.4.2", release_url="https://r", signing_key="ssh-ed25519 AAAA")
    assert old_style.binary == BinarySource(version="v1.4.2", release_url="https://r", signing_key="ssh-ed25519 AAAA")
    with pytest.raises(TypeError, match=r"'gpu-01'.*binary=BinarySource\(\.\.\.\) or its fields \(version\), not both"):
        NodeArgs(**common, binary=BinarySource(version="v1.4.2"), version="v1.4.3")
    with pytest.raises(TypeError, match=r"'gpu-01': binary must be a BinarySource"):
        NodeArgs(**common)


@pulumi.runtime.test
def test_each_agent_is_given_its_share_of_the_rollout_never_the_canary_list(monitor):
    """Naming another canary must leave every other node's inputs (and state) as they were."""
    import dataclasses

    from pulumi.runtime import rpc

    from llmgw_pulumi.config.specs import Rollout

    policy = Rollout(max_parallel=2, canaries=("gpu-01",), directory="/home/op/.local/state/r")
    nodes = [Node(n, dataclasses.replace(node_args(i), rollout=policy))
             for n, i in (("gpu-01", "gpu-01"), ("gpu-02", pulumi.Output.from_input("gpu-02")))]

    def check(_: Any) -> None:
        given = {r.name: rpc.deserialize_properties(r.object)["rollout"] for r in monitor.of_type(
            "pulumi-python:dynamic/llmgw:AgentInstall")}
        assert given == {"gpu-01": {"max_parallel": 2, "canary": True, "directory": "/home/op/.local/state/r"},
                         "gpu-02": {"max_parallel": 2, "canary": False, "directory": "/home/op/.local/state/r"}}

    return pulumi.Output.all(*(n.agent.urn for n in nodes)).apply(check)


@pulumi.runtime.test
def test_a_node_records_the_line_that_made_it_and_its_resources_no_call_stack(monitor):
    import pulumi.runtime.resource as sdk_resource

    recorder = sdk_resource._get_stack_trace
    mine = pulumi.ProviderResource("pulumi-python", "mine")  # a resource of the test's own: its stack is recorded
    made_at = sys._getframe().f_lineno + 1
    node = Node("gpu-01", node_args("gpu-01"))
    assert sdk_resource._get_stack_trace is recorder  # the SDK is as it was once the node is made

    def check(_: Any) -> None:
        (own,) = [r for r in monitor.of_type(PROVIDER_TYPE) if r.name == "mine"]
        assert len(own.stackTrace.frames) >= 2, own.stackTrace  # the control: this test and pytest's frames
        (registered,) = monitor.of_type("llmgw:index:Node")
        assert [(Path(f.pc.uri).name, f.pc.line) for f in registered.stackTrace.frames] == [(Path(__file__).name, made_at)]
        assert (registered.sourcePosition.uri, registered.sourcePosition.line) == (
            registered.stackTrace.frames[0].pc.uri, made_at)
        children = [r for r in monitor.requests if r.name == "gpu-01" or r.type == PROVIDER_TYPE and r.name != "mine"]
        assert sorted(r.type for r in children) == sorted([*NODE_TYPES, "llmgw:index:Node", PROVIDER_TYPE])
        for r in children:
            if r.type != "llmgw:index:Node":
                assert (len(r.stackTrace.frames), r.HasField("sourcePosition")) == (0, False), r.type

    return settle(node.engine_check.urn, mine.urn).apply(check)


@pulumi.runtime.test
def test_a_node_made_where_no_frame_is_recorded_records_none(monitor):
    # llmgw_pulumi.stack.program makes every Node so: each would record the same line of the package's program.
    with recorded_frames(0):
        node = Node("gpu-01", node_args("gpu-01"))

    def check(_: Any) -> None:
        (registered,) = monitor.of_type("llmgw:index:Node")
        assert (len(registered.stackTrace.frames), registered.HasField("sourcePosition")) == (0, False), registered

    return settle(node.engine_check.urn).apply(check)
