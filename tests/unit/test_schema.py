"""One schema for settings: each declared once, and every reader (stack config, check, agent.yaml, replace keys,
defaults, the description for other languages) reads that declaration; and the schema's own checks word for word
(what counts as not known yet, nested settings, required settings, the one error a resource's check raises)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pulumi.output import Unknown

import llmgw_pulumi
from lab.doubles import llmgw as double
from llmgw_pulumi.config import schema, specs, stack_config
from llmgw_pulumi.config.agent_settings import AgentSettings, BinarySource, Discovery
from llmgw_pulumi.config.schema import Problems, Spelling
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.nodestate import desired
from llmgw_pulumi.providers import agent, certificate, engines, identity
from llmgw_pulumi.stack import node
from tests.unit import RELEASE_KEY

PACKAGE = Path(llmgw_pulumi.__file__).parent

# The documented recipe (docs/operations.md, "Adding an agent.yaml option"): one declaration in AgentSettings.
LOG_LEVEL = ('    log_level: str | None = setting("logLevel", validate.interface, default=None, agent_yaml="log_level",\n'
             '                                    doc="How much the agent logs.")\n')
ANCHOR = "    @staticmethod\n    def collect(props: Mapping[str, Any], problems: Problems) -> None:\n        collect_fields(AgentSettings"

PROBE = textwrap.dedent("""
    import json, sys
    from llmgw_pulumi import desired, node, stack_config
    from llmgw_pulumi.config.agent_settings import AgentSettings
    from llmgw_pulumi.errors import StackConfigError
    from llmgw_pulumi.providers.agent import AgentInstallProvider

    config = {"pkiDir": "/pki", "servers": ["cp1:7443"], "ssh": {"privateKeyPath": "/k"},
              "agent": {"version": "v1.4.2", "releaseUrl": "https://r.example",
                        "signingKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOye5XaKTaeYA/zgWk9ecXIR32Hr3T4v0AfbdBmZ70Cl"},
              "nodes": [{"id": "gpu-01", "address": "10.0.0.11", "logLevel": "debug"}]}
    settings = stack_config.parse(config).nodes[0].settings
    try:
        stack_config.parse({**config, "nodes": [{"id": "gpu-01", "address": "10.0.0.11", "logLevel": "no such level!"}]})
        refused = []
    except StackConfigError as exc:
        refused = [p[:2] for p in exc.problems]
    inputs = json.loads(sys.argv[1])
    checked = AgentInstallProvider().check({}, {**inputs, "log_level": "debug"})
    bad = AgentInstallProvider().check({}, {**inputs, "log_level": "no such level!"})
    print(json.dumps({
        "settings": settings.log_level,
        "refused": refused,
        "agent_yaml": checked.inputs["agent_yaml"],
        "check_failures": [f.reason for f in bad.failures],
        "described": [i.config_key for i in node.node_settings() if i.path == ("settings", "log_level")],
    }))
""")


def test_adding_an_agent_yaml_option_is_one_declaration(tmp_path: Path) -> None:
    from tests.unit.provider_inputs import AGENT

    copy = tmp_path / "llmgw_pulumi"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / "config" / "agent_settings.py").read_text()
    assert source.count(ANCHOR) == 1, "the recipe's anchor: the end of AgentSettings' declarations"
    (copy / "config" / "agent_settings.py").write_text(source.replace(ANCHOR, LOG_LEVEL + "\n" + ANCHOR))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    inputs = {k: v for k, v in AGENT.items() if k not in ("agent_yaml", "unit")}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(inputs)], capture_output=True, text=True, env=env,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["settings"] == "debug"  # stack config: a node's logLevel
    assert seen["refused"] == [["node gpu-01", "logLevel"]]  # its validator, named as the stack config spells it
    assert "\nlog_level: debug\n" in seen["agent_yaml"]  # rendered by check, where the declaration says
    assert len(seen["check_failures"]) == 1 and "log_level: 'no such level!' is not" in seen["check_failures"][0]
    assert seen["described"] == ["logLevel"]


def test_without_the_declaration_the_option_is_nowhere() -> None:
    # The control of the test above: the package as it is has no such option.
    assert "log_level" not in {f.name for f in schema.settings_of(AgentSettings)}
    assert "logLevel" not in stack_config.NODE_KEYS
    text = desired.render_agent_yaml("gpu-01", AgentSettings(servers=("cp1:7443",)), "gpu-01")
    assert "log_level" not in text


def test_every_agent_yaml_key_declared_is_one_the_test_double_accepts() -> None:
    keys = {i.agent_yaml for i in schema.describe(AgentSettings) if len(i.path) == 1 and i.agent_yaml}
    assert keys == {"servers", "mgmt_addr", "mgmt_interface", "fabrics", "discovery", "engines"}
    assert keys | {"server", "tls", "node_id"} == set(double.CONFIG_KEYS)


def test_agent_yaml_says_every_option_where_it_did() -> None:
    # Byte for byte what the package wrote before the schema (an upgrade must not rewrite agent.yaml).
    settings = AgentSettings(
        servers=("cp1:7443", "cp2:7443"), mgmt_addr="10.1.0.1", mgmt_interface="bond0",
        fabrics=(specs.Fabric("ib-east", ("mlx5_0",)),),
        discovery=specs.Discovery(nvidia_smi="/opt/nv/nvidia-smi", ib_root="/sys/class/infiniband"),
        engines={"llamacpp": "/opt/llama/bin/llama-server"})
    assert desired.render_agent_yaml("gpu-01", settings, "host-7").splitlines()[2:] == [
        "servers:", "- cp1:7443", "- cp2:7443", "tls:", "  ca: /etc/llmgw/ca.pem", "  cert: /etc/llmgw/agent.pem",
        "  key: /etc/llmgw/agent-key.pem", "node_id: gpu-01", "mgmt_addr: 10.1.0.1", "mgmt_interface: bond0",
        "fabrics:", "- name: ib-east", "  hcas:", "  - mlx5_0", "discovery:", "  nvidia_smi: /opt/nv/nvidia-smi",
        "engines:", "  llamacpp:", "    bin: /opt/llama/bin/llama-server"]


def test_replace_keys_and_defaults_are_read_from_the_declarations() -> None:
    node_keys = ("node_id", "connection.host", "connection.port")
    assert agent.REPLACE_KEYS == identity.REPLACE_KEYS == certificate.REPLACE_KEYS == node_keys
    assert engines.REPLACE_KEYS == ("connection.host", "connection.port")
    assert schema.defaults(specs.CertificateSpec, ("validity_hours", "key_origin")) == {
        "validity_hours": specs.DEFAULT_VALIDITY_HOURS, "key_origin": "node"}
    assert agent.BINARY_KEYS == ("version", "release_url", "binary_path", "binary_sha256")
    with pytest.raises(AssertionError):
        schema.defaults(specs.CertificateSpec, ("node_id",))  # required: it has no default


def test_fabrics_and_discovery_are_declared_once() -> None:
    for name in ("fabrics", "discovery"):
        mine = {f.name: f for f in dataclasses.fields(specs.EngineCheckSpec)}[name]
        theirs = {f.name: f for f in dataclasses.fields(AgentSettings)}[name]
        assert mine.metadata["collect"] is theirs.metadata["collect"]
        assert mine.metadata["config"] is None and theirs.metadata["config"] == name


def test_node_settings_describe_every_field_of_node_args() -> None:
    described = node.node_settings()
    top = [i.path[0] for i in described if len(i.path) == 1]
    assert top == [f.name for f in dataclasses.fields(node.NodeArgs)]
    assert all(i.doc for i in described), [i.path for i in described if not i.doc]
    by_path = {i.path: i for i in described}
    assert by_path[("settings", "discovery", "ib_root")].config_key == "ibRoot"
    assert by_path[("settings", "discovery")].nested and by_path[("binary",)].config_key == "agent"
    assert by_path[("validity_hours",)].default == specs.DEFAULT_VALIDITY_HOURS
    assert by_path[("connection", "host")].default == schema.REQUIRED and by_path[("connection", "host")].replaces
    assert by_path[("connection", "private_key")].secret and by_path[("ca_key",)].secret
    assert by_path[("settings", "mgmt_addr")].agent_yaml == "mgmt_addr"


def test_every_stack_config_key_described_is_one_the_stack_config_has() -> None:
    where = {"settings": stack_config.NODE_SCHEMA, "binary": stack_config.AGENT_SCHEMA,
             "rollout": stack_config.ROLLOUT_SCHEMA,
             "connection": {**stack_config.NODE_SCHEMA, **stack_config.SSH_SCHEMA}}
    checked = 0
    for info in node.node_settings():
        if len(info.path) == 2 and info.config_key is not None and info.path[0] in where:
            assert info.config_key in where[info.path[0]], info.path
            checked += 1
    assert checked > 20


def test_one_binary_type_from_stack_config_to_the_agent_inputs() -> None:
    config = {"pkiDir": "/pki", "servers": ["cp1:7443"], "ssh": {"privateKeyPath": "/k"},
              "agent": {"version": "v1.4.2", "releaseUrl": "https://r.example/", "fetch": "operator", "signingKey": RELEASE_KEY},
              "nodes": [{"id": "gpu-01", "address": "10.0.0.11"}]}
    source = stack_config.parse(config).agent
    assert type(source) is BinarySource and source.release_url == "https://r.example/"  # as given: state keeps it
    inputs = schema.to_inputs(source)
    assert inputs == {"version": "v1.4.2", "release_url": "https://r.example/", "fetch": "operator", "signing_key": RELEASE_KEY}
    assert set(inputs) <= set(agent.BINARY_KEYS) | set(agent.RELEASE_KEYS)


# --------------------------------------------------------------------------- the schema's own checks


UNKNOWN = Unknown()
RELATIVE = ("'bin/nvidia-smi' is relative", "give the absolute path of nvidia-smi on the node, starting with /")


@pytest.mark.parametrize("value, unknown", [
    (UNKNOWN, True), ({"a": UNKNOWN}, True), ({"a": 1, "b": {"c": [1, UNKNOWN]}}, True), ([1, UNKNOWN], True),
    ((UNKNOWN,), True), ({"a": 1, "b": [1, {"c": 2}]}, False), ([], False), ({}, False), ("Unknown", False), (None, False),
])
def test_a_value_is_unknown_when_it_holds_an_unknown_at_any_depth(value: Any, unknown: bool) -> None:
    assert schema.is_unknown(value) is unknown


def _nested(cls: type, value: Any, spelling: Spelling = Spelling.INPUTS, where: str = "settings.discovery") -> list[Any]:
    problems = Problems("gpu-01", spelling)
    schema.nested_settings(cls)(value, problems, where)
    return problems.items


@pytest.mark.parametrize("value,kind", [("/usr/bin/nvidia-smi", "a string ('/usr/bin/nvidia-smi')"),
                                        (["nvidia_smi"], "a list"), (5, "a number (5)")])
def test_nested_settings_that_are_not_a_mapping_are_refused(value: Any, kind: str) -> None:
    assert _nested(Discovery, value) == [("settings.discovery", f"is {kind}, not a mapping of discovery settings",
                                          "pass it as {'nvidia_smi': '...'}")]


def test_nested_settings_not_known_yet_are_checked_when_they_are() -> None:
    assert _nested(Discovery, UNKNOWN) == []


def test_an_unknown_nested_key_is_named_under_its_parent_with_the_nearest_key_in_the_readers_spelling() -> None:
    assert _nested(Discovery, {"nvidia_sm": "/usr/bin/nvidia-smi"}) == [
        ("settings.discovery.nvidia_sm", "is not a discovery setting", "did you mean nvidia_smi?")]
    assert _nested(Discovery, {"nvidiaSm": "/usr/bin/nvidia-smi"}, Spelling.STACK_CONFIG, "nodes[0].discovery") == [
        ("nodes[0].discovery.nvidiaSm", "is not a discovery setting", "did you mean nvidiaSmi?")]
    # Each spelling knows only its own keys: the input name in the stack config is not a setting there.
    assert _nested(Discovery, {"nvidia_smi": "/usr/bin/nvidia-smi"}, Spelling.STACK_CONFIG, "d") == [
        ("d.nvidia_smi", "is not a discovery setting", "did you mean nvidiaSmi?")]
    assert _nested(specs.Rollout, {"zzz": 1}, where="rollout") == [
        ("rollout.zzz", "is not a rollout setting", "use one of canaries, directory, max_parallel")]


def test_nested_settings_are_each_checked_named_under_their_parent() -> None:
    assert _nested(Discovery, {"nvidia_smi": "bin/nvidia-smi", "ib_root": "/sys/class/infiniband"}) == [
        ("settings.discovery.nvidia_smi", *RELATIVE)]
    assert _nested(Discovery, {"nvidiaSmi": "bin/nvidia-smi"}, Spelling.STACK_CONFIG, "nodes[0].discovery") == [
        ("nodes[0].discovery.nvidiaSmi", *RELATIVE)]
    assert _nested(Discovery, {"nvidia_smi": "/usr/bin/nvidia-smi"}) == []


def test_a_required_setting_left_out_is_missing_and_an_optional_one_is_not() -> None:
    problems = Problems("gpu-01")
    schema.collect_fields(specs.Connection, {"user": "deploy"}, problems, prefix="connection.")
    assert problems.items == [("connection.host", "is missing", "give the node's IP address or DNS name")]
    partial = Problems("gpu-01")  # a node's settings that fall back to the stack's
    schema.collect_fields(specs.Connection, {"user": "deploy"}, partial, prefix="connection.", partial=True)
    assert partial.items == []


def test_a_check_raises_its_first_problem_naming_the_node_the_field_and_the_fix() -> None:
    props = {"node_id": "gpu-07", "connection": {"host": "10.0.0.11", "port": 0, "wait": -1}}  # two problems
    with pytest.raises(ConfigError) as err:
        schema.raise_problems(specs.IdentitySpec.collect, props)
    assert err.value.field == "connection.port"
    assert str(err.value) == "gpu-07: connection.port: 0 is not a TCP port\n  fix: use a whole number from 1 to 65535"
    with pytest.raises(ConfigError) as named:
        schema.raise_problems(specs.IdentitySpec.collect, props, "node gpu-07")
    assert str(named.value).startswith("node gpu-07: connection.port: 0 is not a TCP port\n")


def test_a_check_without_a_node_id_names_the_node_question_mark_and_one_without_problems_returns_the_node() -> None:
    with pytest.raises(ConfigError) as err:
        schema.raise_problems(specs.Connection.collect, {"user": "deploy"})
    assert str(err.value) == "?: connection.host: is missing\n  fix: give the node's IP address or DNS name"
    good = {"host": "10.0.0.11", "user": "deploy"}
    assert schema.raise_problems(specs.Connection.collect, {**good, "node_id": "gpu-03"}) == "gpu-03"
    assert schema.raise_problems(specs.Connection.collect, good, "gpu-04") == "gpu-04"
    assert schema.raise_problems(specs.Connection.collect, good) == "?"
