"""Every config mistake named at once, precisely: a value of the wrong type says what it is and how to write it
(the `pulumi config set --path` commands for the stack's config), an IPv6 server needs its brackets, a misspelled
namespace or key is named with the nearest one, a node list's malformed entry names its file, line and field, a
host key's fingerprint is not taken for the key, and a program checks a node's NodeArgs as a whole.

Problems are asserted by class, field and the presence of a fix, not by their wording.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pulumi
import pytest

import llmgw_pulumi
from llmgw_pulumi.config import node_list, stack_config
from llmgw_pulumi.config.agent_settings import AgentSettings, BinarySource
from llmgw_pulumi.errors import ConfigError, StackConfigError
from llmgw_pulumi.stack.node import ConnectionArgs, check_node_args
from tests.unit import RELEASE_KEY
from tests.unit.good_configs import good_node_args

GOOD: dict[str, Any] = {
    "pkiDir": "/srv/llmgw/pki",
    "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"},
    "nodes": [{"id": "gpu-01", "address": "10.0.0.11"},
              {"id": "gpu-02", "address": "10.0.0.12", "fabric": {"name": "ib-east", "hcas": ["mlx5_0"]}}],
}
FINGERPRINTS = ["SHA256:" + "nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8",
                "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48", "16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48"]


def changed(**top: Any) -> dict[str, Any]:
    return {**copy.deepcopy(GOOD), **top}


def with_node(i: int, **settings: Any) -> dict[str, Any]:
    config = changed()
    config["nodes"][i].update(settings)
    return config


def problems(config: dict[str, Any], **kwargs: Any) -> list[tuple[str, str, str, str]]:
    with pytest.raises(StackConfigError) as caught:
        stack_config.parse(config, **kwargs)
    return caught.value.problems


def one(found: list[tuple[str, str, str, str]], field: str) -> tuple[str, str, str, str]:
    matching = [p for p in found if p[1] == field]
    assert len(matching) == 1, f"no single problem of {field} in {found}"
    return matching[0]


def test_the_good_config_has_no_problem() -> None:
    assert len(stack_config.parse(GOOD).nodes) == 2  # the positive control of every case below


# --------------------------------------------------------------------------- a value of the wrong type


@pytest.mark.parametrize("config,node,field,given,key", [
    (changed(servers="cp1:7443"), "llmgw", "servers", "a string", "'llmgw:servers[0]' cp1:7443"),
    (changed(nodes={"gpu-01": {"address": "10.0.0.11"}}), "llmgw", "nodes", "a mapping", "'llmgw:nodes[0].id' gpu-01"),
    (with_node(1, fabric={"name": "ib-east", "hcas": "mlx5_0"}), "node gpu-02", "fabric.hcas", "a string",
     "'llmgw:nodes[1].fabric.hcas[0]' mlx5_0"),
    (with_node(0, engines="/opt/vllm/bin/vllm"), "node gpu-01", "engines", "a string", "'llmgw:nodes[0].engines.vllm.bin'"),
    (changed(agent="v1.4.2"), "llmgw", "agent", "a string", "llmgw:agent.version v1.4.2"),
    (changed(ssh="deploy"), "llmgw", "ssh", "a string", "llmgw:ssh.user deploy"),
    (changed(rollout=["gpu-01"]), "llmgw", "rollout", "a list", "llmgw:rollout.maxParallel"),
    (changed(rollout={"canary": {"gpu-01": True}}), "llmgw", "rollout.canary", "a mapping", "'llmgw:rollout.canary[0]'"),
    (with_node(0, jump=5), "node gpu-01", "jump", "a number", "'llmgw:nodes[0].jump[0]'"),
    (with_node(0, fabrics={"name": "ib-east"}), "node gpu-01", "fabrics", "a mapping", "'llmgw:nodes[0].fabrics[0].name'"),
    (with_node(0, discovery="/usr/bin/nvidia-smi"), "node gpu-01", "discovery", "a string", "'llmgw:nodes[0].discovery."),
], ids=["servers", "nodes", "hcas", "engines", "agent", "ssh", "rollout", "canary", "jump", "fabrics", "discovery"])
def test_a_wrong_type_says_what_it_is_and_the_command_that_sets_it(config: dict[str, Any], node: str, field: str,
                                                                   given: str, key: str) -> None:
    where, _, problem, fix = one(problems(config), field)
    assert where == node
    assert problem.startswith(f"is {given}") and "not " in problem
    assert "pulumi config set --path " + key in fix
    assert "empty or missing" not in problem


def test_a_nested_wrong_type_is_removed_before_it_is_set() -> None:
    # `pulumi config set --path` cannot turn a nested string into a list: the fix removes it first.
    _, _, _, fix = one(problems(with_node(1, fabric={"name": "ib-east", "hcas": "mlx5_0"})), "fabric.hcas")
    assert fix.index("pulumi config rm --path 'llmgw:nodes[1].fabric.hcas'") < fix.index("pulumi config set")
    # A top-level key is replaced by the set itself.
    assert "pulumi config rm" not in one(problems(changed(servers="cp1:7443")), "servers")[3]


def test_a_list_item_of_the_wrong_type_is_rewritten_in_the_file() -> None:
    # Neither `pulumi config rm` (it shifts the list) nor `set --path` (it cannot retype an item) fixes a list item.
    config = changed()
    config["nodes"].append("gpu-03")
    where, field, problem, fix = one(problems(config), "nodes[2]")
    assert where == "llmgw" and problem.startswith("is a string") and "llmgw:nodes[2]" in fix
    assert "pulumi config" not in fix


def test_servers_given_as_one_string_are_listed_from_its_words() -> None:
    _, _, _, fix = one(problems(changed(servers="cp1:7443 cp2:7443")), "servers")
    assert "'llmgw:servers[0]' cp1:7443" in fix and "'llmgw:servers[1]' cp2:7443" in fix


def test_missing_servers_are_still_missing() -> None:
    config = changed()
    del config["servers"]
    _, _, problem, fix = one(problems(config), "servers")
    # The same fix as a resource's inputs get (tests/unit/test_specs.py): only a wrong type's fix is the reader's own.
    assert "missing" in problem and "cp1.example.net:7443" in fix


def test_a_wrong_type_in_a_node_list_file_is_written_in_the_file(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(textwrap.dedent("""\
        - id: gpu-01
          address: 10.0.0.11
          fabric: {name: ib-east, hcas: mlx5_0}
        """))
    config = {k: v for k, v in GOOD.items() if k != "nodes"} | {"inventory": "nodes.yaml"}
    with pytest.raises(StackConfigError) as caught:
        node_list.parse(config, tmp_path)
    where, _, problem, fix = one(caught.value.problems, "fabric.hcas")
    assert "nodes.yaml line 1" in where and "gpu-01" in where
    assert problem.startswith("is a string") and "hcas: [mlx5_0]" in fix and "pulumi config" not in fix


# --------------------------------------------------------------------------- IPv6 servers


@pytest.mark.parametrize("server,bracketed", [("2001:db8::10:7443", "[2001:db8::10]:7443"), ("::1:7443", "[::1]:7443"),
                                              ("2001:db8::10", "[2001:db8::10]:7443")])
def test_an_ipv6_server_without_brackets_is_refused_with_the_bracketed_form(server: str, bracketed: str) -> None:
    _, _, problem, fix = one(problems(changed(servers=["cp1.example.net:7443", server])), "servers[1]")
    assert "IPv6" in problem and bracketed in fix


def test_an_ipv6_server_in_brackets_is_taken() -> None:
    assert stack_config.parse(changed(servers=["[2001:db8::10]:7443"])).nodes[0].settings.servers == (
        "[2001:db8::10]:7443",)


@pytest.mark.parametrize("field", ["address", "mgmtAddr"])
def test_a_node_address_with_a_port_says_to_give_the_port_apart(field: str) -> None:
    _, _, problem, fix = one(problems(with_node(0, **{field: "10.0.0.11:22"})), field)
    assert "port" in problem and "10.0.0.11," in fix


# --------------------------------------------------------------------------- misspelled names


@pytest.mark.parametrize("key,meant", [("llmwg:agent", "llmgw:agent"), ("lmgw:nodes", "llmgw:nodes"),
                                       ("llmgw2:servers", "llmgw:servers"), ("llm:servers", "llmgw:servers")])
def test_a_key_under_a_misspelled_namespace_is_named_with_the_namespace_meant(key: str, meant: str) -> None:
    where, _, problem, fix = one(problems(GOOD, other_keys=[key, "aws:region", "pulumi:tags"]), key)
    assert where == "llmgw" and "namespace" in problem and f"did you mean {meant}?" in fix


def test_keys_of_other_namespaces_are_left_alone() -> None:
    assert stack_config.parse(GOOD, other_keys=["aws:region", "pulumi:tags", "gcp:project", "llm:x"]).nodes


def test_a_misspelled_key_under_a_misspelled_namespace_names_both() -> None:
    _, _, _, fix = one(problems(GOOD, other_keys=["llmwg:severs"]), "llmwg:severs")
    assert "llmgw:severs" in fix and "servers" in fix.replace("severs", "")


def test_a_misspelled_llmgw_key_is_named_with_the_nearest_one() -> None:
    _, _, problem, fix = one(problems(changed(severs=["cp1:7443"])), "severs")
    assert "did you mean servers?" in fix


# --------------------------------------------------------------------------- node list entries


def test_a_node_list_entry_with_an_empty_key_names_the_file_line_node_and_key(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text('- id: gpu-01\n  address: 10.0.0.11\n- id: gpu-02\n  address: 10.0.0.12\n'
                                         '  "": x\n- gpu-03\n')
    config = {k: v for k, v in GOOD.items() if k != "nodes"} | {"inventory": "nodes.yaml"}
    with pytest.raises(StackConfigError) as caught:
        node_list.parse(config, tmp_path)
    found = caught.value.problems
    where, field, problem, fix = one(found, "''")
    assert where == "nodes.yaml line 3 (node gpu-02)" and problem and fix
    where, field, problem, fix = one(found, "entry")
    assert where == "nodes.yaml line 6" and problem.startswith("is a string") and "id: gpu-01" in fix
    assert all(p[1] for p in found), found  # no problem without a field


def test_an_empty_key_in_llmgw_nodes_is_quoted() -> None:
    where, _, _, fix = one(problems(with_node(1, **{"": 1})), "''")
    assert where == "node gpu-02" and fix


# --------------------------------------------------------------------------- host-key fingerprints


@pytest.mark.parametrize("fingerprint", FINGERPRINTS)
def test_a_fingerprint_given_as_host_key_says_what_to_give_instead(fingerprint: str) -> None:
    _, _, problem, fix = one(problems(with_node(0, hostKey=fingerprint)), "hostKey")
    assert "fingerprint" in problem and "ssh-keyscan -t ed25519" in fix and "ssh-ed25519 AAAA" in fix


def test_a_jump_hosts_fingerprint_is_named_too() -> None:
    found = problems(with_node(0, jump=[{"address": "deploy@bastion", "hostKey": FINGERPRINTS[0]}]))
    assert "fingerprint" in one(found, "jump[0].host_key")[2]


# --------------------------------------------------------------------------- every problem at once


def test_three_unrelated_mistakes_are_reported_in_one_run() -> None:
    config = changed(servers="cp1:7443")
    config["nodes"][1]["hostKey"] = FINGERPRINTS[0]
    found = problems(config, other_keys=["llmwg:agent"])
    assert {p[1] for p in found} == {"servers", "hostKey", "llmwg:agent"}


def test_good_node_args_have_no_problem() -> None:
    assert check_node_args(good_node_args()) == [] and good_node_args().problems() == []


def test_node_args_are_checked_as_a_whole() -> None:
    args = good_node_args(pki_dir="pki", connection=ConnectionArgs(host="10.0.0.11", host_key=FINGERPRINTS[0]),
                 settings=AgentSettings(servers="cp1:7443", fabrics=[{"name": "ib-east", "hcas": "mlx5_0"}]),
                 binary=BinarySource(version="v1.4"), fail_on_engine_problems="yes")
    found = args.problems()
    assert all(isinstance(e, ConfigError) and e.node == "gpu-01" and e.fix for e in found)
    assert [e.field for e in found] == ["pki_dir", "connection.host_key", "settings.servers",
                                        "settings.fabrics[0].hcas", "binary.version", "fail_on_engine_problems"]
    assert "a string" in str(found[2]) and "fingerprint" in str(found[1])


def test_a_connection_reached_for_a_key_made_elsewhere_is_checked_too() -> None:
    found = check_node_args(good_node_args(key_origin="operator", connection=ConnectionArgs(host="10.0.0.11:22")))
    assert [e.field for e in found] == ["connection.host"]


def test_node_args_values_not_known_yet_are_left_to_their_resource() -> None:
    later = pulumi.Output.from_input("cp1:7443")
    assert check_node_args(good_node_args(settings=AgentSettings(servers=later),
                                 connection=ConnectionArgs(host=pulumi.Output.from_input("x y")))) == []


def test_the_check_is_exported_from_the_package() -> None:
    assert llmgw_pulumi.check_node_args is check_node_args
    assert "check_node_args" in llmgw_pulumi.__all__
