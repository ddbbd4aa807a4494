"""Node as a component package (llmgw_pulumi.stack.component): its schema from the declarations, its inputs checked as
stack config, its wiring under the SDK's mock monitor, and the Python the dynamic-provider plugin would run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.errors import InputPropertiesError

from llmgw_pulumi.config import stack_config
from llmgw_pulumi.config.schema import Spelling, names
from llmgw_pulumi.config.specs import Hop
from llmgw_pulumi.stack import component, component_types
from llmgw_pulumi.stack.component_host import NodeProvider
from llmgw_pulumi.stack.shards import shard_name, shard_of
from tests.conftest import REPO
from tests.unit.mock_monitor import NODE_TYPES, PROVIDER_TYPE, RecordingMonitor, settle

GOOD = {"nodeId": "gpu-01", "address": "10.0.0.11", "pkiDir": "/pki", "servers": ["cp1:7443"],
        "agent": {"version": "v1.4.2", "releaseUrl": "https://releases.example.net", "sha256": {"amd64": "a" * 64}},
        "ssh": {"user": "deploy", "privateKeyPath": "/keys/id_ed25519", "wait": 30}}


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(NodeProvider().schema or "{}")
    return loaded


def paths(props: dict[str, Any], types: dict[str, Any], prefix: str = "") -> set[str]:
    """Every input as a dotted path, nested types followed (as stack_config.key_paths spells settings)."""
    found: set[str] = set()
    for key, prop in props.items():
        found.add(prefix + key)
        ref = (prop.get("items") or prop.get("additionalProperties") or prop).get("$ref", "")
        if ref.startswith("#/types/"):
            found |= paths(types[ref.removeprefix("#/types/")]["properties"], types, f"{prefix}{key}.")
    return found


def test_the_inputs_are_the_stack_configs_settings_of_one_node():
    s = schema()
    node = s["resources"]["llmgw:index:Node"]
    given = paths(node["inputProperties"], s["types"])
    # What the stack config declares: the node's settings and the stack-wide ones (a node's `id` is `nodeId`).
    # llmgw:inventory (a file of many nodes) is the stack's, not one node's.
    declared = {p.removeprefix("nodes.") for p in stack_config.key_paths() if p not in ("nodes", "inventory")}
    declared = {"nodeId" + p[2:] if p == "id" or p.startswith("id.") else p for p in declared}
    # A jump host is one setting there ("user@host", or a list); here always a list of the Hop spec's settings.
    hops = {f"{jump}.{key}" for jump in ("jump", "ssh.jump") for key in names(Hop, Spelling.STACK_CONFIG).values()}
    assert given == declared | hops
    assert set(node["requiredInputs"]) == {"nodeId", "address"}


def test_the_input_types_are_the_declared_ones_and_documented():
    s = schema()
    props, types = s["resources"]["llmgw:index:Node"]["inputProperties"], s["types"]
    ssh = types[props["ssh"]["$ref"].removeprefix("#/types/")]["properties"]
    assert (ssh["port"]["type"], ssh["wait"]["type"], ssh["user"]["type"]) == ("integer", "number", "string")
    assert (props["servers"]["type"], props["servers"]["items"]["type"]) == ("array", "string")
    assert props["failOnEngineProblems"]["type"] == "boolean"
    fabric = types[props["fabrics"]["items"]["$ref"].removeprefix("#/types/")]["properties"]
    assert set(fabric) == {"name", "hcas"} and fabric["hcas"]["type"] == "array"
    # The docs are the declarations' (the spec's attribute docstrings).
    assert props["hostKey"]["description"].startswith("Pinned host key as 'TYPE BASE64'")
    assert "Seconds to keep retrying" in ssh["wait"]["description"]
    # Only a VM's address and host key, the control plane's servers, agent and ssh (read once known), and the
    # secrets may be other resources' outputs; the rest is plain.
    assert {k for k, p in props.items() if not p.get("plain")} == \
        {"address", "hostKey", "servers", "agent", "ssh", *component.SECRETS}
    for key in ("agent", "ssh"):  # and their descriptions say how an output not known in a preview is taken
        assert props[key]["description"].endswith(component_types.SETTLED_DOC), props[key]["description"]


def test_the_secret_settings_are_secret_inputs_of_the_schema():
    props = schema()["resources"]["llmgw:index:Node"]["inputProperties"]
    secret = {key for key, prop in props.items() if prop.get("secret") is True}
    assert secret == {"caKey", "sshPrivateKey", "sshKeyPassphrase", "caKeyPassphrase"}
    assert all(props[key]["type"] == "string" for key in secret)


def test_the_outputs_are_typed_values():
    s = schema()
    outputs = s["resources"]["llmgw:index:Node"]["properties"]
    assert set(outputs) == {"hostname", "hostKey", "certificateNotAfter", "agentVersion", "problems", "inventory",
                            "readiness"}
    assert outputs["readiness"]["type"] == "string"
    assert outputs["problems"]["type"] == "array" and outputs["problems"]["items"]["type"] == "object"
    assert all("$ref" not in p or p["$ref"] != "pulumi.json#/Any" for p in outputs.values()), outputs
    inventory = s["types"][outputs["inventory"]["$ref"].removeprefix("#/types/")]
    assert (set(inventory["properties"]), inventory["properties"]["hcas"]["items"]["type"]) == \
        ({"gpus", "driver", "cuda", "hcas"}, "string")
    gpu = s["types"][inventory["properties"]["gpus"]["items"]["$ref"].removeprefix("#/types/")]["properties"]
    assert {k: p["type"] for k, p in gpu.items()} == {"index": "integer", "name": "string", "memoryMib": "integer",
                                                      "uuid": "string", "pciBusId": "string", "computeCap": "string"}
    assert all(p.get("description") for p in (*gpu.values(), *inventory["properties"].values()))


def test_the_inventory_output_is_engine_checks_in_the_sdks_spelling():
    read = {"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "uuid": "GPU-1", "pci_bus_id":
                      "00000000:18:00.0", "compute_cap": "9.0"}], "driver": "570.1", "cuda": "12.8", "hcas": ["mlx5_0"]}
    assert component_types.inventory_output(read) == {
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memoryMib": 143771, "uuid": "GPU-1",
                  "pciBusId": "00000000:18:00.0", "computeCap": "9.0"}],
        "driver": "570.1", "cuda": "12.8", "hcas": ["mlx5_0"]}
    assert component_types.inventory_output(None) == {"gpus": [], "driver": "", "cuda": "", "hcas": []}


def test_the_sdks_have_this_projects_own_names():
    language = schema()["language"]
    assert language["nodejs"]["packageName"] == component.NODEJS_PACKAGE
    assert not component.NODEJS_PACKAGE.startswith("@pulumi/")
    assert language["go"]["importBasePath"] == component.GO_IMPORT_PATH
    assert "example.com" not in component.GO_IMPORT_PATH and "pulumi/" not in component.GO_IMPORT_PATH
    examples = Path(REPO, "examples")
    assert f'from "{component.NODEJS_PACKAGE}"' in (examples / "typescript-vm" / "index.ts").read_text()
    assert f'"{component.GO_IMPORT_PATH}"' in (examples / "go-vm" / "main.go").read_text()


def test_bad_values_get_the_stack_configs_list_naming_the_node_field_and_fix():
    bad = {**GOOD, "servers": ["not a server"], "ssh": {**GOOD["ssh"], "wait": -1}, "hostKey": "garbage",
           "engines": {"llamacp": {"bin": "/x"}}}
    with pytest.raises(InputPropertiesError) as caught:
        component.parse("gpu-01", bad)
    text = str(caught.value.message)
    assert text.startswith("llmgw Node gpu-01 has 4 problems:\n"), text
    assert "  node gpu-01: servers[0]: 'not a server' contains spaces" in text
    assert "  node gpu-01: ssh.wait: -1 is out of range\n    fix: give 0 to 3600 seconds" in text
    assert "  node gpu-01: hostKey: " in text
    assert "  node gpu-01: engines.llamacp: is not an engine the agent knows" in text
    # The same problems as the stack config reports for the same node.
    try:
        stack_config.parse({k: v for k, v in bad.items() if k not in ("nodeId", "address", "hostKey", "engines")}
                           | {"nodes": [{"id": "gpu-01", "address": "10.0.0.11", "hostKey": "garbage",
                                         "engines": {"llamacp": {"bin": "/x"}}}]})
    except stack_config.StackConfigError as exc:
        assert [(f, p) for _, f, p, _ in exc.problems] == [
            (f, p) for f, p in (line.split(": ", 2)[1:] for line in text.splitlines()[1::2])]
    else:
        raise AssertionError("the stack config took the bad values")


def test_a_missing_node_id_is_named_by_its_input_name():
    with pytest.raises(InputPropertiesError) as caught:
        component.parse("gpu-01", {k: v for k, v in GOOD.items() if k != "nodeId"})
    assert "node gpu-01: nodeId: is missing" in caught.value.message


def test_an_unknown_address_is_checked_later_and_kept_as_an_output():
    address = pulumi.Output.from_input("10.0.0.11")
    parsed = component.parse("gpu-01", {**GOOD, "address": address})
    assert parsed.outputs == {"address": address}
    assert parsed.node.node_id == "gpu-01" and parsed.spec.pki_dir == "/pki"


def test_servers_may_be_another_resources_output_checked_later():
    servers = pulumi.Output.from_input(["cp1.example.net:7443"])
    parsed = component.parse("gpu-01", {**GOOD, "servers": servers})
    assert parsed.outputs == {"servers": servers}
    assert parsed.node.node_id == "gpu-01"
    # A list holding an output is one Output of the whole list.
    held = component.parse("gpu-01", {**GOOD, "servers": ["cp1:7443", pulumi.Output.from_input("cp2:7443")]})
    assert set(held.outputs) == {"servers"} and isinstance(held.outputs["servers"], pulumi.Output)


def test_an_output_for_a_plain_setting_is_refused_by_name():
    with pytest.raises(InputPropertiesError) as caught:
        component.parse("gpu-01", {**GOOD, "pkiDir": pulumi.Output.from_input("/pki")})
    assert "node gpu-01: pkiDir: is another resource's output" in caught.value.message


def as_construct_gives(value: Any) -> Any:
    """``value`` as the SDK's provider server hands a construct call an input that depends on another resource
    (pulumi.provider.server.ProviderServicer._select_value: an Output, already resolved)."""
    import asyncio

    from pulumi.provider.server import ProviderServicer

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(ProviderServicer._select_value(value, deps={"urn:pulumi:s::p::x:y:Z::release"}))
    finally:
        loop.close()


def test_agent_and_ssh_may_be_outputs_read_once_known():
    agent = {**GOOD["agent"], "version": "v1.5.0"}
    given = {**GOOD, "agent": as_construct_gives(agent), "ssh": as_construct_gives({**GOOD["ssh"], "wait": 45})}
    assert isinstance(given["agent"], pulumi.Output) and isinstance(given["ssh"], pulumi.Output)
    parsed = component.parse("gpu-01", given)
    assert parsed.spec.agent.version == "v1.5.0" and parsed.spec.agent.release_sha256 == {"amd64": "a" * 64}
    assert parsed.node.connection.wait == 45 and parsed.outputs == {}
    # Read, they are checked as any value: a bad one gets the stack config's problem.
    with pytest.raises(InputPropertiesError) as caught:
        component.parse("gpu-01", {**GOOD, "agent": as_construct_gives({**agent, "version": "1.5"})})
    assert "node gpu-01: agent.binary: is missing: version 1.5 is not a release tag" in caught.value.message


def test_agent_or_ssh_not_known_yet_in_a_preview_is_refused_by_name():
    from pulumi.output import Unknown

    for key in ("agent", "ssh"):
        with pytest.raises(InputPropertiesError) as caught:  # what deserialize_properties(keep_unknowns=True) gives
            component.parse("gpu-01", {**GOOD, key: as_construct_gives(Unknown())})  # type: ignore[no-untyped-call]
        assert f"node gpu-01: {key}: is an output not known yet in this preview" in caught.value.message
        assert "at `up` it is known" in caught.value.message


def test_the_python_the_plugin_would_run_is_checked():
    assert component.python_problem("gpu-01", {"PULUMI_RUNTIME_VIRTUALENV": str(REPO / ".venv")}) is None
    missing = component.python_problem("gpu-01", {"PULUMI_PYTHON_CMD": "/usr/bin/python3"})
    assert missing is not None
    assert missing.startswith("llmgw Node gpu-01: the dynamic-provider plugin would run /usr/bin/python3 (no "
                              "PULUMI_RUNTIME_VIRTUALENV is set), which does not have llmgw-pulumi"), missing
    assert f"fix: export PULUMI_RUNTIME_VIRTUALENV={REPO / '.venv'} " in missing  # the checkout's, which has one
    not_a_venv = component.python_problem("gpu-01", {"PULUMI_RUNTIME_VIRTUALENV": "/nonexistent"})
    assert not_a_venv is not None and "PULUMI_RUNTIME_VIRTUALENV=/nonexistent, which does not" in not_a_venv


@pulumi.runtime.test
def test_the_vm_options_and_the_shard_reach_the_four_resources(monitor: RecordingMonitor, tmp_path):  # noqa: F811
    vm = pulumi.CustomResource("command:local:Command", "vm", {"stdout": None})
    key = tmp_path / "id_ed25519"
    key.write_text("read only when a node is reached")
    key.chmod(0o600)  # a key others can read is refused (tests/unit/test_operator_files.py)
    good = {**GOOD, "ssh": {**GOOD["ssh"], "privateKeyPath": str(key)}}
    node = component.Node("gpu-01", {**good, "address": vm.urn.apply(lambda _: "10.0.0.30")},
                          pulumi.ResourceOptions(depends_on=[vm], replace_with=[vm]))
    other = component.Node("gpu-02", {**good, "nodeId": "gpu-02", "address": "10.0.0.12"})

    def check(urns: list[str]) -> None:
        children = [r for r in monitor.of_type(NODE_TYPES) if r.name == "gpu-01"]
        assert len(children) == 4
        for r in children:
            assert list(r.replace_with) == [urns[0]], r.type
            assert urns[0] in r.dependencies, r.type
            assert r.provider.split("::")[3] == shard_name(shard_of("gpu-01")), r.type
        # One provider resource per shard in use for the whole deployment, however many nodes construct it.
        names = [p.name for p in monitor.of_type(PROVIDER_TYPE)]
        assert sorted(names) == sorted({shard_name(shard_of(n)) for n in ("gpu-01", "gpu-02")})

    return settle(vm.urn, node.problems, other.problems).apply(check)


@pulumi.runtime.test
def test_servers_given_as_an_output_reach_the_agent_s_settings(monitor: RecordingMonitor, tmp_path):  # noqa: F811
    from google.protobuf import json_format

    control_plane = pulumi.CustomResource("command:local:Command", "cp", {"stdout": None})
    key = tmp_path / "id_ed25519"
    key.write_text("read only when a node is reached")
    key.chmod(0o600)
    servers = control_plane.urn.apply(lambda _: ["cp-from-another-stack.example.net:7443"])
    node = component.Node("gpu-01", {**GOOD, "servers": servers, "ssh": {**GOOD["ssh"], "privateKeyPath": str(key)}})

    def check(_: Any) -> None:
        given = [json_format.MessageToDict(r.object) for r in monitor.of_type(NODE_TYPES) if r.name == "gpu-01"]
        with_servers = [g for g in given if "cp-from-another-stack.example.net:7443" in json.dumps(g)]
        assert len(with_servers) == 1, given  # the AgentInstall, whose agent.yaml names them
        assert "cp1:7443" not in json.dumps(given)

    return settle(control_plane.urn, node.problems).apply(check)
