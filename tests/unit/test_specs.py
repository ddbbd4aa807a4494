"""Validated once: a bad value says the same in stack config and in a resource's inputs, each under its own name.

The stack config names a setting in camelCase (`mgmtAddr`), a resource its
input (`mgmt_addr`); both are fields of the same spec, checked by the same
validator, so the problem and the fix an operator reads are the same text.

Then every refusal of the specs' own collectors, word for word: the field named, the problem and the fix, in the
order they are found; and what is not refused (an unknown value, an absent optional one).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pulumi.output import Unknown

from llmgw_pulumi.config import specs, stack_config
from llmgw_pulumi.config.schema import Problems, Spelling
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
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


# --------------------------------------------------------------------------- each refusal of the specs' own collectors, word for word


UNKNOWN = Unknown()
CONN_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEu9J1lBjuLVgDt1cm0hmFhjmfgjLlRkL2sM1hvT2JW6"
CERTS = {"ca_pem": PEMS["ca_pem"], "cert_pem": PEMS["cert_pem"]}
"""An identity's PEMs when the node made its key (keyOrigin node): no key_pem."""
CONNECTION_MISSING = ("is missing", "give the node's SSH connection: host, user and private key")
NOT_TEXT = ("is not text", "set it as a secret string")
NOT_PEM = ("is missing or not PEM", "pass the outputs of the node's ClientCertificate")
PKI_DIR_MISSING = ("pki_dir", "is missing", "give the PKI directory (pkiDir) holding ca.pem and ca-key.pem, "
                   "or another signer (llmgw:signer)")
CONNECTION_FOR_THE_KEY = ("connection", "is missing: the node makes its key pair (keyOrigin node), so it must be reached",
                          "pass ClientCertificateArgs.connection, or key_origin='operator' to make the key here")
NOT_JUMP_LIST = "not a list of jump hosts (user@host[:port])"
JUMP_LIST_FIX = "pass it as [{'address': 'deploy@bastion.example.net'}]"
BAD_PORT = ("0 is not a TCP port", "use a whole number from 1 to 65535")
BAD_HOST_KEY = ("is not an SSH public key", "paste the node's /etc/ssh/ssh_host_ed25519_key.pub (a trailing comment is "
                "dropped), or a known_hosts line without the host: 'ssh-ed25519 AAAAC3...'")
BAD_ID_FIX = "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
"""validate.py's words (test_validate_messages says them all); here they only show which check ran."""
NOT_JUMP = "not a jump host (user@host[:port])"
NOT_CONNECTION = "not a connection (ConnectionArgs: host, user, private key...)"
CONNECTION_FIX = "pass it as {'host': '10.0.0.11', 'user': 'deploy'}"

KEY_MARK = " ".join(("PRIVATE", "KEY"))
"""A private key's BEGIN-line marker, written so that no file here looks like it holds a key."""


def found(collect: Callable[[Mapping[str, Any], Problems], None], props: Mapping[str, Any],
          spelling: Spelling = Spelling.INPUTS) -> list[tuple[str, str, str]]:
    problems = Problems("gpu-01", spelling)
    collect(props, problems)
    return problems.items


# --------------------------------------------------------------------------- the connection


def test_a_connection_not_given_is_missing() -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", "connection": None, **CERTS}) == [
        ("connection", *CONNECTION_MISSING)]
    problems = Problems("gpu-01")
    specs.Connection.collect(None, problems, "jump[0]")  # under the name it is given
    assert problems.items == [("jump[0]", *CONNECTION_MISSING)]


@pytest.mark.parametrize("given,kind", [("10.0.0.11", "a string ('10.0.0.11')"), (["10.0.0.11"], "a list"),
                                        (22, "a number (22)")])
def test_a_connection_that_is_not_a_mapping_says_what_it_is(given: Any, kind: str) -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", "connection": given, **CERTS}) == [
        ("connection", f"is {kind}, {NOT_CONNECTION}", CONNECTION_FIX)]
    problems = Problems("gpu-01")
    specs.Connection.collect(given, problems, "jump[0]")  # under the name it is given
    assert problems.items == [("jump[0]", f"is {kind}, {NOT_CONNECTION}", CONNECTION_FIX)]


def test_an_unknown_connection_is_checked_when_it_is_known() -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", "connection": UNKNOWN, **CERTS}) == []
    # A mapping with an unknown value in it is checked, all but that value.
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", **CERTS,
                                              "connection": {**CONN, "host": UNKNOWN, "port": 0}}) == [
        ("connection.port", *BAD_PORT)]


@pytest.mark.parametrize("value", [5, b"secret", ["secret"]])
def test_a_passphrase_that_is_not_text_is_refused_unechoed(value: Any) -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", **CERTS, "connection": {**CONN, "passphrase": value}}) == [
        ("connection.passphrase", *NOT_TEXT)]
    assert found(specs.CertificateSpec.collect, {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "operator",
                                                 "ca_key_passphrase": value}) == [("ca_key_passphrase", *NOT_TEXT)]


def test_a_passphrase_given_as_text_or_not_known_yet_is_taken() -> None:
    for value in ("correct horse", UNKNOWN):
        assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", **CERTS,
                                                  "connection": {**CONN, "passphrase": value}}) == []
        assert found(specs.CertificateSpec.collect, {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "operator",
                                                     "ca_key_passphrase": value}) == []


def test_an_unknown_private_key_is_checked_when_it_is_known() -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "gpu-01", **CERTS,
                                              "connection": {**CONN, "private_key": UNKNOWN}}) == []


# --------------------------------------------------------------------------- jump hosts


def _with_jump(jump: Any) -> dict[str, Any]:
    return {"node_id": "gpu-01", **CERTS, "connection": {**CONN, "jump": jump}}


@pytest.mark.parametrize("jump,kind", [("deploy@bastion", "a string ('deploy@bastion')"),
                                       ({"address": "deploy@bastion"}, "a mapping"), (5, "a number (5)")])
def test_jump_hosts_as_inputs_are_a_list(jump: Any, kind: str) -> None:
    assert found(specs.IdentitySpec.collect, _with_jump(jump)) == [
        ("connection.jump", f"is {kind}, {NOT_JUMP_LIST}", JUMP_LIST_FIX)]


@pytest.mark.parametrize("hop,kind", [("deploy@bastion", "a string ('deploy@bastion')"), (5, "a number (5)"),
                                      (["deploy@bastion"], "a list")])
def test_each_jump_host_input_is_a_mapping(hop: Any, kind: str) -> None:
    assert found(specs.IdentitySpec.collect, _with_jump([{"address": "ok@bastion"}, hop])) == [
        ("connection.jump[1]", f"is {kind}, {NOT_JUMP}",
         "pass it as {'address': 'deploy@bastion.example.net'}")]


def test_every_jump_host_is_checked_after_one_that_is_not_a_mapping() -> None:
    assert found(specs.IdentitySpec.collect, _with_jump([5, {"address": "deploy@bastion", "host_key": "nonsense"}])) == [
        ("connection.jump[0]", f"is a number (5), {NOT_JUMP}",
         "pass it as {'address': 'deploy@bastion.example.net'}"),
        ("connection.jump[1].host_key", *BAD_HOST_KEY)]


def test_each_jump_host_input_is_checked_as_a_hop_named_as_inputs() -> None:
    assert found(specs.IdentitySpec.collect, _with_jump([{"address": "deploy@bastion", "host_key": "nonsense"}])) == [
        ("connection.jump[0].host_key", *BAD_HOST_KEY)]


def test_unknown_jump_hosts_are_checked_when_they_are_known() -> None:
    assert found(specs.IdentitySpec.collect, _with_jump(UNKNOWN)) == []


def test_the_stack_config_gives_jump_hosts_as_text_a_list_of_it_or_mappings() -> None:
    def jump(value: Any) -> list[tuple[str, str, str]]:
        problems = Problems("gpu-01", Spelling.STACK_CONFIG)
        specs._collect_jump(value, problems, "jump")
        return problems.items

    assert jump("deploy@bastion") == []
    assert jump(["deploy@bastion", {"address": "deploy@b2:2222", "hostKey": CONN_KEY}]) == []
    assert jump([{"address": "deploy@b2", "hostKey": "nonsense"}]) == [
        ("jump[0].host_key", *BAD_HOST_KEY)]
    assert jump(5) == [("jump", f"is a number (5), {NOT_JUMP_LIST}", "write it as jump: [deploy@bastion.example.net]")]
    assert jump([5]) == [("jump[0]", f"is a number (5), {NOT_JUMP}", "write it as jump[0]: deploy@bastion.example.net")]
    # As inputs the same text is not a list: only the stack config spells jump hosts as text.
    problems = Problems("gpu-01")
    specs._collect_jump("deploy@bastion", problems, "jump")
    assert problems.items == [("jump", f"is a string ('deploy@bastion'), {NOT_JUMP_LIST}",
                               "pass it as [{'address': 'deploy@bastion.example.net'}]")]



# --------------------------------------------------------------------------- the certificate


def test_the_renewal_window_is_shorter_than_the_validity_with_the_defaults_filled_in() -> None:
    fix = "renew some time before expiry, e.g. a tenth of the validity"
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "operator"}
    assert found(specs.CertificateSpec.collect, {**base, "renew_before_hours": 8760.0}) == [
        ("renew_before_hours", "8760 is not shorter than the validity (8760 h)", fix)]  # the default validity
    assert found(specs.CertificateSpec.collect, {**base, "renew_before_hours": 8759.5}) == []
    assert found(specs.CertificateSpec.collect, {**base, "validity_hours": 720.0}) == [
        ("renew_before_hours", "720 is not shorter than the validity (720 h)", fix)]  # the default window
    assert found(specs.CertificateSpec.collect, {**base, "validity_hours": 720.5}) == []
    problems = Problems("gpu-01", Spelling.STACK_CONFIG)
    specs.check_renewal({"validityHours": 10, "renewBeforeHours": 12}, problems, "nodes[0].")
    assert problems.items == [("nodes[0].renewBeforeHours", "12 is not shorter than the validity (10 h)", fix)]


def test_a_renewal_window_that_is_not_a_number_is_refused_once_by_its_own_check() -> None:
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "operator"}
    assert [p[0] for p in found(specs.CertificateSpec.collect, {**base, "renew_before_hours": "soon"})] == [
        "renew_before_hours"]


@pytest.mark.parametrize("signer", [None, {"kind": "pkiDir"}, {}])
def test_the_pki_directory_signer_needs_its_directory(signer: Any) -> None:
    props = {"node_id": "gpu-01", "key_origin": "operator", **({"signer": signer} if signer is not None else {})}
    assert found(specs.CertificateSpec.collect, props) == [PKI_DIR_MISSING]
    assert found(specs.CertificateSpec.collect, {**props, "pki_dir": "/pki"}) == []


def test_another_signer_needs_no_pki_directory() -> None:
    ca = "-----BEGIN CERTIFICATE-----\nCA\n"
    props = {"node_id": "gpu-01", "key_origin": "operator", "signer": {"kind": "caKey", "ca_pem": ca}}
    assert found(specs.CertificateSpec.collect, props) == []
    assert found(specs.CertificateSpec.collect, {**props, "signer": {"kind": "command", "ca_pem": ca,
                                                                      "command": ["/usr/bin/sign"]}}) == []
    assert found(specs.CertificateSpec.collect, {**props, "signer": UNKNOWN}) == []  # known later


def test_a_signers_problems_are_named_as_the_signer_names_them() -> None:
    props = {"node_id": "gpu-01", "key_origin": "operator", "signer": {"kind": "caKey"}}
    assert found(specs.CertificateSpec.collect, props) == [
        ("signer.ca", "is missing or not a PEM certificate",
         "give the CA certificate (ca.pem) as a path on this machine or as its PEM text")]


@pytest.mark.parametrize("origin", [None, "node"])
def test_a_key_made_on_the_node_needs_the_connection(origin: str | None) -> None:
    props = {"node_id": "gpu-01", "pki_dir": "/pki", **({"key_origin": origin} if origin else {})}
    assert found(specs.CertificateSpec.collect, props) == [CONNECTION_FOR_THE_KEY]
    assert found(specs.CertificateSpec.collect, {**props, "connection": CONN}) == []
    assert found(specs.CertificateSpec.collect, {**props, "connection": "10.0.0.11"}) == [
        ("connection", f"is a string ('10.0.0.11'), {NOT_CONNECTION}", CONNECTION_FIX)]
    assert found(specs.CertificateSpec.collect, {**props, "connection": {**CONN, "port": 0}}) == [
        ("connection.port", *BAD_PORT)]


def test_all_of_a_certificates_problems_are_named_in_order() -> None:
    assert found(specs.CertificateSpec.collect, {"node_id": "gpu-01", "renew_before_hours": 9000.0}) == [
        ("renew_before_hours", "9000 is not shorter than the validity (8760 h)",
         "renew some time before expiry, e.g. a tenth of the validity"),
        PKI_DIR_MISSING, CONNECTION_FOR_THE_KEY]


# --------------------------------------------------------------------------- the identity


IDENTITY = {"node_id": "gpu-01", "connection": CONN, **CERTS}


def test_an_identity_whose_key_the_node_made_has_no_key_pem() -> None:
    assert found(specs.IdentitySpec.collect, IDENTITY) == []
    assert found(specs.IdentitySpec.collect, {**IDENTITY, "key_origin": "node"}) == []
    assert found(specs.IdentitySpec.collect, {**IDENTITY, "key_pem": UNKNOWN}) == []
    for origin in ({}, {"key_origin": "node"}):
        assert found(specs.IdentitySpec.collect, {**IDENTITY, **origin, "key_pem": PEMS["key_pem"]}) == [
            ("key_pem", "is given, but the node makes its own key (keyOrigin node)",
             "pass key_origin='operator' with the key, or no key_pem")]


def test_an_identity_whose_key_was_made_here_needs_it_as_pem() -> None:
    operator = {**IDENTITY, "key_origin": "operator"}
    assert found(specs.IdentitySpec.collect, {**operator, "key_pem": PEMS["key_pem"]}) == []
    assert found(specs.IdentitySpec.collect, {**operator, "key_pem": UNKNOWN}) == []
    assert found(specs.IdentitySpec.collect, operator) == [("key_pem", *NOT_PEM)]
    # The marker is the end of a private key's BEGIN line: a certificate given as the key is refused.
    assert found(specs.IdentitySpec.collect, {**operator, "key_pem": PEMS["cert_pem"]}) == [("key_pem", *NOT_PEM)]
    assert found(specs.IdentitySpec.collect, {**operator, "key_pem": f"-----BEGIN EC {KEY_MARK}-----\nK\n"}) == []
    assert found(specs.IdentitySpec.collect, {**operator, "key_pem": "-----BEGIN EC private key-----\nK\n"}) == [
        ("key_pem", *NOT_PEM)]


@pytest.mark.parametrize("name", ["ca_pem", "cert_pem"])
@pytest.mark.parametrize("value", [None, "", "CERTIFICATE", 5, f"-----BEGIN {KEY_MARK}-----\n"])
def test_an_identitys_certificates_are_pem(name: str, value: Any) -> None:
    props = {**IDENTITY, name: value}
    assert found(specs.IdentitySpec.collect, props) == [(name, *NOT_PEM)]


def test_an_identity_checks_its_id_connection_and_key_origin_in_order() -> None:
    assert found(specs.IdentitySpec.collect, {"node_id": "GPU 01", "connection": None, "key_origin": "here",
                                              "ca_pem": "x", "cert_pem": PEMS["cert_pem"]}) == [
        ("node_id", "'GPU 01' is not a valid DNS label", BAD_ID_FIX),
        ("connection", *CONNECTION_MISSING),
        ("key_origin", "'here' is not node or operator",
         "write node (the node makes its key pair and it never leaves it; the default) or operator (the key is made on "
         "the machine running Pulumi and kept in state, encrypted)"),
        ("ca_pem", *NOT_PEM)]


# --------------------------------------------------------------------------- the agent and its rollout


def test_an_agent_needs_the_hostname_the_identity_read() -> None:
    fix = "pass the hostname NodeIdentity read from the node"
    assert found(specs.AgentSpec.collect, AGENT) == []
    for hostname in (None, "", 5):
        assert found(specs.AgentSpec.collect, {**AGENT, "hostname": hostname}) == [("hostname", "is missing", fix)]
    assert found(specs.AgentSpec.collect, {**AGENT, "hostname": UNKNOWN}) == []


def test_an_agents_rollout_is_a_mapping_of_rollout_settings() -> None:
    assert found(specs.AgentSpec.collect, {**AGENT, "rollout": {"max_parallel": 2, "canary": True}}) == []
    # The stack's canary list is the run's (llmgw_pulumi.rollout), never in a node's inputs.
    assert found(specs.AgentSpec.collect, {**AGENT, "rollout": {"canaries": ["gpu-01"]}}) == [
        ("rollout.canaries", "is not a rollout setting", "did you mean canary?")]
    assert [f for f, _, _ in found(specs.AgentSpec.collect, {**AGENT, "rollout": {"canary": "gpu-01"}})] == [
        "rollout.canary"]
    assert found(specs.AgentSpec.collect, {**AGENT, "rollout": {"max_paralel": 2}}) == [
        ("rollout.max_paralel", "is not a rollout setting", "did you mean max_parallel?")]
    assert found(specs.AgentSpec.collect, {**AGENT, "rollout": {"max_parallel": 0}}) == [
        ("rollout.max_parallel", "0 is not a whole number above 0", "give how many agents may restart at once, e.g. 2")]
    assert found(specs.AgentSpec.collect, {**AGENT, "rollout": "fast"}) == [
        ("rollout", "is a string ('fast'), not a mapping of rollout settings", "pass it as {'max_parallel': '...'}")]


def test_an_agent_checks_its_id_and_connection_first() -> None:
    assert found(specs.AgentSpec.collect, {**AGENT, "node_id": "GPU 01", "connection": None, "hostname": ""}) == [
        ("node_id", "'GPU 01' is not a valid DNS label", BAD_ID_FIX),
        ("connection", *CONNECTION_MISSING),
        ("hostname", "is missing", "pass the hostname NodeIdentity read from the node")]


def _canaries(value: Any) -> list[tuple[str, str, str]]:
    problems = Problems("gpu-01", Spelling.STACK_CONFIG)
    specs.collect_canaries(value, problems, "rollout.canary")
    return problems.items


def test_canaries_are_node_ids_each_once() -> None:
    assert _canaries("gpu-01") == [] and _canaries(["gpu-01", "gpu-02"]) == [] and _canaries(UNKNOWN) == []
    assert _canaries(5) == [("rollout.canary", "is a number (5), not a list of node ids (the nodes to update first)",
                             "write it as canary: [gpu-01]")]
    assert _canaries(["gpu-01", "gpu-01"]) == [("rollout.canary", "lists a node twice", "list each canary once")]
    assert _canaries(["gpu-01", "GPU 02"]) == [
        ("rollout.canary[1]", "'GPU 02' is not a valid DNS label", BAD_ID_FIX)]
