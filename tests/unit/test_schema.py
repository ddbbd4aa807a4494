"""One schema for settings: each declared once, and every reader (stack config, check, agent.yaml, replace keys,
defaults, the description for other languages) reads that declaration."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import llmgw_pulumi
from lab.doubles import llmgw as double
from llmgw_pulumi import desired, node, schema, specs, stack_config
from llmgw_pulumi.agent_settings import AgentSettings, BinarySource
from llmgw_pulumi.providers import agent, certificate, engines, identity
from tests.unit import RELEASE_KEY

PACKAGE = Path(llmgw_pulumi.__file__).parent

# The documented recipe (docs/operations.md, "Adding an agent.yaml option"): one declaration in AgentSettings.
LOG_LEVEL = ('    log_level: str | None = setting("logLevel", validate.interface, default=None, agent_yaml="log_level",\n'
             '                                    doc="How much the agent logs.")\n')
ANCHOR = "    @staticmethod\n    def collect(props: Mapping[str, Any], problems: Problems) -> None:\n        collect_fields(AgentSettings"

PROBE = textwrap.dedent("""
    import json, sys
    from llmgw_pulumi import desired, node, stack_config
    from llmgw_pulumi.agent_settings import AgentSettings
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
    source = (copy / "agent_settings.py").read_text()
    assert source.count(ANCHOR) == 1, "the recipe's anchor: the end of AgentSettings' declarations"
    (copy / "agent_settings.py").write_text(source.replace(ANCHOR, LOG_LEVEL + "\n" + ANCHOR))
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
