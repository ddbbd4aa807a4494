"""Validated once: a bad value says the same in stack config and in a resource's inputs, each under its own name.

The stack config names a setting in camelCase (`mgmtAddr`), a resource its
input (`mgmt_addr`); both are fields of the same spec, checked by the same
validator, so the problem and the fix an operator reads are the same text.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmgw_pulumi import specs, stack_config
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from llmgw_pulumi.stack_config import StackConfigError
from tests.unit.good_configs import mutate
from tests.unit.provider_inputs import AGENT, CONN, PEMS

INPUTS: dict[type, dict[str, Any]] = {
    AgentInstallProvider: AGENT,
    ClientCertificateProvider: {"node_id": "gpu-01", "pki_dir": "/pki"},
    NodeIdentityProvider: {"node_id": "gpu-01", "connection": CONN, **PEMS},
    EngineCheckProvider: {"node_id": "gpu-01", "connection": CONN, "known_host_key": AGENT["known_host_key"]},
}

# (case, stack-config path, bad value, node and key the stack config names,
#  provider, input path, bad value there (None: the same), the input name its check names)
SAME = [
    ("management address", ("nodes", 0, "mgmtAddr"), "not an address!", "node gpu-01", "mgmtAddr",
     AgentInstallProvider, ("mgmt_addr",), None, "mgmt_addr"),
    ("management interface", ("nodes", 0, "mgmtInterface"), "averyveryverylongifname", "node gpu-01", "mgmtInterface",
     AgentInstallProvider, ("mgmt_interface",), None, "mgmt_interface"),
    ("server without a port", ("servers",), ["cp1.example.net"], "llmgw", "servers[0]",
     AgentInstallProvider, ("servers",), None, "servers[0]"),
    ("no servers", ("servers",), [], "llmgw", "servers", AgentInstallProvider, ("servers",), None, "servers"),
    ("a control plane twice", ("nodes", 0, "servers"), ["a.example:1", "a.example:1"], "node gpu-01", "servers",
     AgentInstallProvider, ("servers",), None, "servers"),
    ("bad hca", ("nodes", 0, "fabrics"), [{"name": "ib-east", "hcas": ["mlx5 0"]}], "node gpu-01", "fabrics[0].hcas[0]",
     AgentInstallProvider, ("fabrics",), None, "fabrics[0].hcas[0]"),
    ("hcas without a fabric", ("nodes", 0, "fabrics"), [{"hcas": ["mlx5_0"]}], "node gpu-01", "fabrics[0].name",
     AgentInstallProvider, ("fabrics",), None, "fabrics[0].name"),
    ("relative ib root", ("nodes", 0, "discovery"), {"ibRoot": "sys/class/infiniband"}, "node gpu-01", "discovery.ibRoot",
     AgentInstallProvider, ("discovery",), {"ib_root": "sys/class/infiniband"}, "discovery.ib_root"),
    ("nvidia-smi with a newline", ("nodes", 0, "discovery"), {"nvidiaSmi": "/opt/nv\n"}, "node gpu-01",
     "discovery.nvidiaSmi", AgentInstallProvider, ("discovery",), {"nvidia_smi": "/opt/nv\n"}, "discovery.nvidia_smi"),
    ("relative engine, agent", ("nodes", 0, "engines"), {"llamacpp": {"bin": "bin/llama-server"}}, "node gpu-01",
     "engines.llamacpp.bin", AgentInstallProvider, ("engines",), None, "engines.llamacpp.bin"),
    ("relative engine, check", ("nodes", 0, "engines"), {"vllm": {"bin": "vllm"}}, "node gpu-01", "engines.vllm.bin",
     EngineCheckProvider, ("engines",), None, "engines.vllm.bin"),
    ("unknown engine", ("nodes", 0, "engines"), {"ollama": {"bin": "/opt/o"}}, "node gpu-01", "engines.ollama",
     EngineCheckProvider, ("engines",), None, "engines.ollama"),
    ("fail on problems not a boolean", ("nodes", 0, "failOnEngineProblems"), "yes", "node gpu-01", "failOnEngineProblems",
     EngineCheckProvider, ("fail_on_problems",), None, "fail_on_problems"),
    ("address", ("nodes", 0, "address"), "10.0.0.300", "node gpu-01", "address",
     NodeIdentityProvider, ("connection", "host"), None, "connection.host"),
    ("port", ("nodes", 0, "port"), 99999, "node gpu-01", "port", AgentInstallProvider, ("connection", "port"), None,
     "connection.port"),
    ("user", ("ssh", "user"), "Bad User", "llmgw", "ssh.user", NodeIdentityProvider, ("connection", "user"), None,
     "connection.user"),
    ("ssh wait", ("ssh", "wait"), -5, "llmgw", "ssh.wait", EngineCheckProvider, ("connection", "wait"), None,
     "connection.wait"),
    ("pinned host key", ("nodes", 0, "hostKey"), "AAAA-not-a-key", "node gpu-01", "hostKey",
     NodeIdentityProvider, ("connection", "host_key"), None, "connection.host_key"),
    ("node id", ("nodes", 0, "id"), "GPU_01", "nodes[0]", "id", ClientCertificateProvider, ("node_id",), None, "node_id"),
    ("pki dir", ("pkiDir",), "pki", "llmgw", "pkiDir", ClientCertificateProvider, ("pki_dir",), None, "pki_dir"),
    ("validity", ("certificate",), {"validityHours": 0}, "llmgw", "certificate.validityHours",
     ClientCertificateProvider, ("validity_hours",), 0, "validity_hours"),
    ("renewal not before expiry", ("certificate",), {"validityHours": 10, "renewBeforeHours": 20}, "llmgw",
     "certificate.renewBeforeHours", ClientCertificateProvider, (), {"validity_hours": 10, "renew_before_hours": 20},
     "renew_before_hours"),
    ("malformed tag", ("agent", "version"), "v1.2", "llmgw", "agent.version", AgentInstallProvider, ("version",), None,
     "version"),
    ("release url", ("agent", "releaseUrl"), "ftp://releases.example.net", "llmgw", "agent.releaseUrl",
     AgentInstallProvider, ("release_url",), None, "release_url"),
    ("dev version without a binary", ("agent", "version"), "v1.2.3-4-gabc", "llmgw", "agent.binary",
     AgentInstallProvider, ("version",), None, "binary_path"),
]


# What each problem says, written here (both paths above read the same text: this is what it must say).
SAYS = {
    "management address": "is not an IP address or a DNS name", "management interface": "is not a network interface name",
    "server without a port": "has no port", "no servers": "is empty", "a control plane twice": "a control plane twice",
    "bad hca": "is not an HCA name", "hcas without a fabric": "without a fabric", "relative ib root": "is relative",
    "nvidia-smi with a newline": "newline", "relative engine, agent": "is relative", "relative engine, check": "is relative",
    "unknown engine": "not an engine the agent knows", "fail on problems not a boolean": "is not true or false",
    "address": "is not an IP address or a DNS name", "port": "is not a TCP port", "user": "is not a user name",
    "ssh wait": "out of range", "pinned host key": "is not an SSH public key", "node id": "is not a valid DNS label",
    "pki dir": "is relative", "validity": "above 0", "renewal not before expiry": "not shorter than the validity",
    "malformed tag": "malformed release tag", "release url": "is not an http",
    "dev version without a binary": "is not a release tag",
}


def set_path(inputs: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(inputs)
    if not path:
        return {**out, **value}
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize("case,path,value,node,key,provider,input_path,input_value,input_name", SAME,
                         ids=[s[0] for s in SAME])
def test_the_same_bad_value_has_the_same_problem_and_fix_in_both(case, path, value, node, key, provider, input_path,
                                                                  input_value, input_name):
    cfg = mutate(path, value)
    if path[:2] == ("nodes", 0) and path[2] == "fabrics":
        cfg["nodes"][0].pop("fabric", None)
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(cfg)
    found = [p for p in err.value.problems if p[:2] == (node, key)]
    assert len(found) == 1, err.value.problems
    _, _, problem, fix = found[0]
    assert SAYS[case] in problem and fix.strip() and fix != problem, (problem, fix)
    inputs = set_path(INPUTS[provider], input_path, value if input_value is None else input_value)
    reasons = [f.reason for f in provider().check({}, inputs).failures]
    assert f"{inputs['node_id']}: {input_name}: {problem}. Fix: {fix}" in reasons, reasons


def test_a_setting_added_to_the_table_is_in_the_stack_config_and_in_the_inputs():
    # Each AgentSettings field is a stack-config key of a node and an input of AgentInstall.
    from llmgw_pulumi.providers import agent

    for f in specs.settings_of(specs.AgentSettings):
        assert f.metadata["config"] in stack_config.NODE_KEYS
        assert f.name in agent.SETTINGS_KEYS


def test_settings_become_the_inputs_stored_in_state():
    settings = specs.AgentSettings(
        servers=("cp1:7443",), mgmt_addr="10.1.0.1", fabrics=(specs.Fabric("ib-east", ("mlx5_0",)),),
        discovery=specs.Discovery(nvidia_smi="/opt/nv/nvidia-smi"), engines={"sglang": "/opt/sg/python"})
    assert specs.to_inputs(settings) == {
        "servers": ["cp1:7443"], "mgmt_addr": "10.1.0.1", "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0"]}],
        "discovery": {"nvidia_smi": "/opt/nv/nvidia-smi"}, "engines": {"sglang": {"python": "/opt/sg/python"}}}
    assert specs.to_inputs(specs.AgentSettings(servers=["cp1:7443"])) == {"servers": ["cp1:7443"]}, \
        "settings not given are absent, as they were before"
    assert specs.AgentSettings.from_props(specs.to_inputs(settings)) == settings


@pytest.mark.parametrize("value", ["hunter2", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA== op@laptop", "", 42],
                         ids=["a password", "a public key", "empty", "not text"])
def test_a_private_key_input_that_is_no_private_key_is_refused_unechoed(value: Any) -> None:
    problems = specs.Problems("gpu-01")
    specs.Connection.collect({"host": "10.0.0.11", "private_key": value}, problems)
    assert problems.items == [("connection.private_key", "is not a private key in PEM/OpenSSH format",
                               "give the SSH private key's contents (as a secret), or its path as private_key_path")]


def test_a_private_key_input_with_its_marker_is_accepted() -> None:
    # The positive control of the test above: the marker is what tells a key from anything else.
    for kind in ("OPENSSH ", "EC ", "RSA ", ""):
        problems = specs.Problems("gpu-01")
        specs.Connection.collect({"host": "10.0.0.11", "private_key": f"-----BEGIN {kind}PRIVATE" + " KEY-----\nK\n"},
                                 problems)
        assert problems.items == [], kind
