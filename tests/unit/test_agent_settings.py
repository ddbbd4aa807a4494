"""Every refusal of agent_settings.py's collectors word for word (control planes, fabrics, engines, the binary),
in both spellings where they differ, and what is not refused (unknown values, the stack config's later version)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pulumi.output import Unknown

from llmgw_pulumi.config import agent_settings
from llmgw_pulumi.config.agent_settings import BinarySource
from llmgw_pulumi.config.schema import Problems, Spelling

UNKNOWN = Unknown()
SHA = "ab" * 32
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEu9J1lBjuLVgDt1cm0hmFhjmfgjLlRkL2sM1hvT2JW6"
RELATIVE_FIX = "give the absolute {} on the node, starting with /"


def found(collect: Callable[[Any, Problems, str], None], value: Any, where: str,
          spelling: Spelling = Spelling.INPUTS) -> list[tuple[str, str, str]]:
    problems = Problems("gpu-01", spelling)
    collect(value, problems, where)
    return problems.items


# --------------------------------------------------------------------------- control planes


@pytest.mark.parametrize("servers", [[], None])
def test_control_planes_are_a_list_that_is_not_empty(servers: Any) -> None:
    assert found(agent_settings.collect_servers, servers, "servers") == [
        ("servers", "is empty or missing", 'list the control planes as host:port, e.g. ["cp1.example.net:7443"]')]


@pytest.mark.parametrize("servers,kind,example", [
    ("cp1:7443", "a string ('cp1:7443')", "['cp1:7443']"), ("cp1:7443, cp2:7443", "a string ('cp1:7443, cp2:7443')",
                                                            "['cp1:7443', 'cp2:7443']"),
    (5, "a number (5)", "['cp1.example.net:7443']"), ({"cp1": 7443}, "a mapping", "['cp1.example.net:7443']")])
def test_control_planes_of_another_type_say_what_they_are(servers: Any, kind: str, example: str) -> None:
    assert found(agent_settings.collect_servers, servers, "servers") == [
        ("servers", f"is {kind}, not a list of host:port", f"pass it as {example}")]


def test_control_planes_not_known_yet_are_checked_when_they_are() -> None:
    assert found(agent_settings.collect_servers, UNKNOWN, "servers") == []
    assert found(agent_settings.collect_servers, ["cp1:7443", UNKNOWN], "servers") == []


def test_each_control_plane_is_checked_by_its_place_and_listed_once() -> None:
    assert found(agent_settings.collect_servers, ["cp1:7443", "cp2:7443"], "nodes[0].servers") == []
    twice = found(agent_settings.collect_servers, ["cp1:7443", "cp2:7443", "cp1:7443"], "nodes[0].servers")
    assert twice == [("nodes[0].servers", "lists a control plane twice", "list each control plane once, in failover order")]
    bad = found(agent_settings.collect_servers, ["cp1:7443", "cp2"], "servers")
    assert [name for name, _, _ in bad] == ["servers[1]"]
    # A value that is not text is refused by its own check, and not counted as a control plane listed twice.
    assert [name for name, _, _ in found(agent_settings.collect_servers, [5, 5], "servers")] == ["servers[0]", "servers[1]"]


# --------------------------------------------------------------------------- fabrics


def test_a_fabric_is_a_mapping_of_a_name_and_hcas() -> None:
    assert found(agent_settings.collect_fabric, {"name": "ib-east", "hcas": ["mlx5_0"]}, "fabrics[0]") == []
    assert found(agent_settings.collect_fabric, UNKNOWN, "fabrics[0]") == []
    for fab, kind in (("ib-east", "a string ('ib-east')"), (["ib-east"], "a list"), (5, "a number (5)")):
        assert found(agent_settings.collect_fabric, fab, "fabrics[1]") == [
            ("fabrics[1]", f"is {kind}, not a {{name, hcas}} mapping",
             "pass it as {'name': 'ib-east', 'hcas': ['mlx5_0']}")]


def test_a_fabrics_unknown_key_is_named_with_the_nearest_one() -> None:
    assert found(agent_settings.collect_fabric, {"name": "ib-east", "hcas": ["mlx5_0"], "hca": ["mlx5_1"]}, "f[0]") == [
        ("f[0].hca", "is not a fabric setting", "did you mean hcas?")]
    assert found(agent_settings.collect_fabric, {"name": "ib-east", "hcas": ["mlx5_0"], "zzz": 1}, "f[0]") == [
        ("f[0].zzz", "is not a fabric setting", "use one of hcas, name")]


@pytest.mark.parametrize("name", [None, ""])
def test_hcas_without_a_fabric_name_are_refused(name: Any) -> None:
    fab = {"hcas": ["mlx5_0"]} if name is None else {"name": name, "hcas": ["mlx5_0"]}
    assert found(agent_settings.collect_fabric, fab, "fabrics[0]") == [
        ("fabrics[0].name", "is missing: HCAs were given without a fabric",
         "name the InfiniBand fabric these HCAs are cabled to; it cannot be discovered")]


@pytest.mark.parametrize("hcas", [None, []])
def test_a_fabric_without_hcas_is_refused(hcas: Any) -> None:
    fab = {"name": "ib-east"} if hcas is None else {"name": "ib-east", "hcas": hcas}
    assert found(agent_settings.collect_fabric, fab, "fabrics[0]") == [
        ("fabrics[0].hcas", "is empty: a fabric without HCAs", "list the node's HCAs on this fabric, e.g. [mlx5_0, mlx5_1]")]


@pytest.mark.parametrize("hcas,kind,example", [("mlx5_0", "a string ('mlx5_0')", "['mlx5_0']"),
                                               ("mlx5_0 mlx5_1", "a string ('mlx5_0 mlx5_1')", "['mlx5_0', 'mlx5_1']"),
                                               (5, "a number (5)", "['mlx5_0', 'mlx5_1']")])
def test_hcas_of_another_type_say_what_they_are(hcas: Any, kind: str, example: str) -> None:
    assert found(agent_settings.collect_fabric, {"name": "ib-east", "hcas": hcas}, "fabrics[0]") == [
        ("fabrics[0].hcas", f"is {kind}, not a list of HCA names", f"pass it as {example}")]


def test_a_fabrics_name_and_hcas_are_each_checked_by_their_place() -> None:
    bad = found(agent_settings.collect_fabric, {"name": "IB East", "hcas": ["mlx5_0", "mlx5 1"]}, "fabrics[2]")
    assert [name for name, _, _ in bad] == ["fabrics[2].name", "fabrics[2].hcas[1]"]
    assert found(agent_settings.collect_fabric, {"name": "ib-east", "hcas": UNKNOWN}, "fabrics[0]") == []
    assert found(agent_settings.collect_fabric, {"name": UNKNOWN, "hcas": ["mlx5_0"]}, "fabrics[0]") == []


def test_fabrics_are_a_list_each_fabric_once() -> None:
    east, west = {"name": "ib-east", "hcas": ["mlx5_0"]}, {"name": "ib-west", "hcas": ["mlx5_1"]}
    assert found(agent_settings.collect_fabrics, [east, west], "fabrics") == []
    assert found(agent_settings.collect_fabrics, UNKNOWN, "fabrics") == []
    assert found(agent_settings.collect_fabrics, east, "nodes[0].fabrics") == [
        ("nodes[0].fabrics", "is a mapping, not a list of {name, hcas} mappings",
         "pass it as [{'name': 'ib-east', 'hcas': ['mlx5_0']}]")]
    assert found(agent_settings.collect_fabrics, [east, west, {**east, "hcas": ["mlx5_2"]}], "fabrics") == [
        ("fabrics[2].name", "fabric 'ib-east' is listed twice", "list each fabric once")]
    assert found(agent_settings.collect_fabrics, [east, "ib-west", east], "fabrics") == [
        ("fabrics[1]", "is a string ('ib-west'), not a {name, hcas} mapping",
         "pass it as {'name': 'ib-east', 'hcas': ['mlx5_0']}"),
        ("fabrics[2].name", "fabric 'ib-east' is listed twice", "list each fabric once")]


# --------------------------------------------------------------------------- engines


def test_engines_are_a_mapping_of_the_engines_the_agent_knows() -> None:
    ok = {"llamacpp": {"bin": "/opt/llama/llama-server"}, "vllm": {"bin": "/opt/vllm/bin/vllm"},
          "sglang": {"python": "/opt/sglang/bin/python"}}
    assert found(agent_settings.collect_engines, ok, "engines") == []
    assert found(agent_settings.collect_engines, UNKNOWN, "engines") == []
    assert found(agent_settings.collect_engines, ["vllm"], "nodes[0].engines") == [
        ("nodes[0].engines", "is a list, not a mapping of engine to {bin: PATH} (sglang: {python: PATH})",
         "pass it as {'vllm': {'bin': '/opt/vllm/bin/vllm'}}")]
    assert found(agent_settings.collect_engines, {"ollama": {"bin": "/opt/o"}, **ok}, "engines") == [
        ("engines.ollama", "is not an engine the agent knows", "use one of llamacpp, vllm, sglang")]


def test_every_engine_is_checked_after_one_that_is_refused() -> None:
    relative = ("engines.vllm.bin", "'vllm' is relative", RELATIVE_FIX.format("vllm executable"))
    assert found(agent_settings.collect_engines, {"ollama": {"bin": "/opt/o"}, "vllm": {"bin": "vllm"}}, "engines") == [
        ("engines.ollama", "is not an engine the agent knows", "use one of llamacpp, vllm, sglang"), relative]
    assert found(agent_settings.collect_engines, {"llamacpp": "/opt/l", "vllm": {"bin": "vllm"}}, "engines") == [
        ("engines.llamacpp", "is a string ('/opt/l'), not a {bin: PATH} mapping",
         "pass it as {'bin': '/opt/l'}"), relative]


@pytest.mark.parametrize("conf", [{"bin": "/opt/sglang/bin/python"}, {"python": "/opt/sglang/bin/python", "bin": "/x"}])
def test_each_engine_has_its_one_key(conf: Any) -> None:
    assert found(agent_settings.collect_engines, {"sglang": conf}, "engines") == [
        ("engines.sglang", "must be {python: PATH}", "write engines.sglang.python: /absolute/path")]


def test_an_engines_executable_is_an_absolute_path_on_the_node() -> None:
    assert found(agent_settings.collect_engines, {"vllm": {"bin": "vllm"}, "sglang": {"python": "bin/python"}},
                 "engines") == [
        ("engines.vllm.bin", "'vllm' is relative", RELATIVE_FIX.format("vllm executable")),
        ("engines.sglang.python", "'bin/python' is relative", RELATIVE_FIX.format("sglang executable"))]


def test_the_engine_map_and_its_inputs_are_each_others_inverse_in_the_agents_order() -> None:
    inputs = {"sglang": {"python": "/p"}, "llamacpp": {"bin": "/l"}, "vllm": {"bin": ""}}
    assert list(agent_settings.engine_map(inputs).items()) == [("llamacpp", "/l"), ("sglang", "/p")]
    assert agent_settings.engines_input({"llamacpp": "/l", "sglang": "/p"}) == {"llamacpp": {"bin": "/l"},
                                                                                  "sglang": {"python": "/p"}}


# --------------------------------------------------------------------------- the binary


def binary(props: dict[str, Any], spelling: Spelling = Spelling.INPUTS, prefix: str = "") -> list[tuple[str, str, str]]:
    problems = Problems("gpu-01", spelling)
    BinarySource.collect(props, problems, prefix)
    return problems.items


NOT_A_RELEASE = ("is missing: version {} is not a release tag, so there is no release to fetch",
                 "give the local llmgw build to copy, or a release tag vX.Y.Z")


def test_a_release_needs_its_url_and_a_local_build_its_path_and_digest() -> None:
    assert binary({"version": "v1.2.3", "release_url": "https://r.example/llmgw"}) == []
    assert [n for n, _, _ in binary({"version": "v1.2.3"})] == ["release_url"]
    assert binary({"version": "1.2.3-dev", "binary_path": "/build/llmgw", "binary_sha256": SHA}) == []
    problem, fix = NOT_A_RELEASE
    assert binary({"version": "1.2.3-dev"}) == [("binary_path", problem.format("1.2.3-dev"), fix)]
    assert binary({"version": "1.2.3-dev"}, Spelling.STACK_CONFIG, "agent.") == [
        ("agent.binary", problem.format("1.2.3-dev"), fix)]
    assert binary({"version": "1.2.3-dev", "binary_path": "/build/llmgw"}) == [
        ("binary_sha256", "is missing", "compute it from the local binary (the node component does)")]
    assert [n for n, _, _ in binary({"version": "1.2.3-dev", "binary_path": "build/llmgw", "binary_sha256": SHA})] == [
        "binary_path"]


def test_a_version_not_known_yet_or_wrong_is_all_that_is_said() -> None:
    assert binary({"version": UNKNOWN}) == []
    assert [n for n, _, _ in binary({"version": "not a version!"})] == ["version"]
    assert [n for n, _, _ in binary({"version": 5, "binary_path": "/b"})] == ["version"]


def test_in_stack_config_a_local_build_needs_no_version_and_pins_no_release() -> None:
    assert binary({"binary": "/build/llmgw"}, Spelling.STACK_CONFIG, "agent.") == []
    assert binary({"binary": "/build/llmgw", "sha256": {"amd64": SHA}}, Spelling.STACK_CONFIG, "agent.") == [
        ("agent.sha256", "pins a release, but a local build is given",
         "remove sha256 (a local build is copied as it is), or give a release version instead of binary")]
    # As inputs a local build has its version (the program read it) and its digest (computed).
    assert [n for n, _, _ in binary({"binary_path": "/build/llmgw", "binary_sha256": SHA})] == ["version"]


def test_how_a_release_is_verified_is_checked_when_given_named_by_the_readers_spelling() -> None:
    release = {"version": "v1.2.3", "release_url": "https://r.example/llmgw"}
    assert binary({**release, "signing_key": KEY, "fetch": "operator", "release_ca": "/etc/ca.pem",
                   "release_sha256": {"amd64": SHA}}) == []
    assert binary({**release, "signing_key": "nonsense"}) == [
        ("signing_key", "is not an OpenSSH public key",
         "paste the public half of the release signing key, one line: 'ssh-ed25519 AAAAC3...' "
         "(`ssh-keygen -y -f KEY` prints it)")]
    assert binary({**release, "signing_key": 5}) == [("signing_key", *binary({**release, "signing_key": "x"})[0][1:])]
    assert binary({**release, "fetch": "here"}) == [
        ("fetch", "'here' is not node or operator",
         "write node (each node downloads the release itself; the default) or operator (downloaded and verified "
         "here, pushed to the nodes over SSH: for nodes that cannot reach the release server)")]
    assert [n for n, _, _ in binary({**release, "release_ca": "ca.pem"})] == ["release_ca"]
    assert [n for n, _, _ in binary({**release, "release_sha256": {"amd64": "00"}})] == ["release_sha256"]
    config = {"version": "v1.2.3", "releaseUrl": "https://r.example/llmgw"}
    assert [n for n, _, _ in binary({**config, "signingKey": "nonsense", "fetch": "here"}, Spelling.STACK_CONFIG,
                                    "agent.")] == ["agent.signingKey", "agent.fetch"]
    # The stack config's CA bundle is a path read later, relative to the project: only an empty one is refused.
    assert binary({**config, "releaseCa": "certs/ca.pem"}, Spelling.STACK_CONFIG, "agent.") == []
    assert binary({**config, "releaseCa": ""}, Spelling.STACK_CONFIG, "agent.") == [
        ("agent.releaseCa", "is empty", "give the path of the release server's CA bundle (PEM) on this machine")]
    assert [n for n, _, _ in binary({**config, "releaseCa": 5}, Spelling.STACK_CONFIG, "agent.")] == ["agent.releaseCa"]
