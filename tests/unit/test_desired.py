"""agent.yaml and the unit, rendered from typed settings (SPEC steps 6 and 8): table-driven."""

import pytest
import yaml

from llmgw_pulumi.config.specs import AgentSettings
from llmgw_pulumi.nodestate import desired

BASE = {"node_id": "gpu-01", "servers": ["cp1.example.net:7443"]}
TLS = {"ca": "/etc/llmgw/ca.pem", "cert": "/etc/llmgw/agent.pem", "key": "/etc/llmgw/agent-key.pem"}

CASES = [
    # (case, extra inputs, hostname, expected document)
    ("one server, hostname is the node id", {}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS}),
    ("several servers keep failover order", {"servers": ["b:1", "a:2", "c:3"]}, "gpu-01",
     {"servers": ["b:1", "a:2", "c:3"], "tls": TLS}),
    ("hostname differs: node_id is written", {}, "ip-10-0-0-7",
     {"server": "cp1.example.net:7443", "tls": TLS, "node_id": "gpu-01"}),
    ("management overrides", {"mgmt_addr": "10.1.2.3", "mgmt_interface": "bond0"}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS, "mgmt_addr": "10.1.2.3", "mgmt_interface": "bond0"}),
    ("fabric with hcas", {"fabrics": [{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}]}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS, "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}]}),
    ("discovery default ib_root is not written",
     {"discovery": {"nvidia_smi": "/opt/nv/nvidia-smi", "ib_root": "/sys/class/infiniband"}}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS, "discovery": {"nvidia_smi": "/opt/nv/nvidia-smi"}}),
    ("discovery non-default ib_root", {"discovery": {"ib_root": "/run/ib"}}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS, "discovery": {"ib_root": "/run/ib"}}),
    ("engines, only those given, sglang by python",
     {"engines": {"sglang": {"python": "/opt/sg/bin/python"}, "llamacpp": {"bin": "/opt/llama server/llama-server"}}}, "gpu-01",
     {"server": "cp1.example.net:7443", "tls": TLS,
      "engines": {"llamacpp": {"bin": "/opt/llama server/llama-server"}, "sglang": {"python": "/opt/sg/bin/python"}}}),
]


@pytest.mark.parametrize("case,extra,hostname,expected", CASES, ids=[c[0] for c in CASES])
def test_agent_yaml_holds_only_the_overrides_given(case, extra, hostname, expected):
    text = desired.render_agent_yaml("gpu-01", AgentSettings.from_props({**BASE, **extra}), hostname)
    assert yaml.safe_load(text) == expected
    assert list(yaml.safe_load(text)) == list(expected), "keys keep the SPEC's order"


def test_agent_yaml_starts_with_a_comment_naming_node_and_writer():
    text = desired.render_agent_yaml("gpu-01", AgentSettings.from_props(BASE), "gpu-01")
    first = text.splitlines()[0]
    assert first.startswith("# gpu-01, written by llmgw-pulumi")


def test_yaml_special_characters_in_values_are_quoted_by_the_emitter():
    # A path with YAML syntax in it must come back exactly, not as a mapping or a comment.
    odd = "/opt/a: b #c/[x]/{y}/'q'/\"dq\"/llama"
    text = desired.render_agent_yaml("gpu-01", AgentSettings.from_props({**BASE, "engines": {"llamacpp": {"bin": odd}}}),
                                     "gpu-01")
    assert yaml.safe_load(text)["engines"]["llamacpp"]["bin"] == odd


def test_unit_has_every_line_the_spec_requires():
    lines = desired.render_unit().splitlines()
    for required in [
        "ExecStart=/usr/local/bin/llmgw agent --config /etc/llmgw/agent.yaml",
        "After=network-online.target",
        "Wants=network-online.target",
        "KillMode=process",
        "Restart=on-failure",
        "RestartSec=2s",
        "StateDirectory=llmgw-agent",
        "WantedBy=multi-user.target",
    ]:
        assert required in lines, required


def test_identity_files_have_spec_modes_and_the_anchor_is_the_ca():
    files = {f.path: f for f in desired.identity_files("CA", "CERT", "KEY")}
    assert {p: oct(f.mode) for p, f in files.items()} == {
        "/etc/llmgw/ca.pem": "0o644",
        "/etc/llmgw/agent.pem": "0o644",
        "/etc/llmgw/agent-key.pem": "0o600",
        "/usr/local/share/ca-certificates/llmgw-ca.crt": "0o644",
    }
    assert files["/usr/local/share/ca-certificates/llmgw-ca.crt"].content == b"CA"
    assert "KEY" not in repr(files["/etc/llmgw/agent-key.pem"])


def test_every_file_a_node_gets_is_in_the_desired_state_as_the_spec_says():
    """SPEC steps 3-6 and 8, written out here rather than computed from the package."""
    table = {(f.path, f.mode, f.owner, f.content, f.resource) for f in desired.NODE_FILES}
    C = desired.Content
    assert table == {
        ("/etc/llmgw/ca.pem", 0o644, "root:root", C.CA_PEM, "NodeIdentity"),
        ("/etc/llmgw/agent.pem", 0o644, "root:root", C.CERT_PEM, "NodeIdentity"),
        ("/etc/llmgw/agent-key.pem", 0o600, "root:root", C.KEY_PEM, "NodeIdentity"),
        ("/usr/local/share/ca-certificates/llmgw-ca.crt", 0o644, "root:root", C.CA_PEM, "NodeIdentity"),
        ("/usr/local/bin/llmgw", 0o755, "root:root", C.BINARY, "AgentInstall"),
        ("/etc/llmgw/agent.yaml", 0o644, "root:root", C.AGENT_YAML, "AgentInstall"),
        ("/etc/systemd/system/llmgw-agent.service", 0o644, "root:root", C.UNIT, "AgentInstall"),
    }
    assert {(d.path, d.mode, d.owner, d.removed_when_empty) for d in desired.DIRECTORIES} == {
        ("/etc/llmgw", 0o755, "root:root", True), ("/usr/local/share/ca-certificates", 0o755, "root:root", False)}
    assert (desired.UNIT_NAME, dict(desired.UNIT_STATE)) == ("llmgw-agent.service", {"active": "active", "enabled": "enabled"})
    assert len({f.name for f in desired.NODE_FILES}) == len(desired.NODE_FILES)


def test_agent_files_take_their_bytes_from_the_rendered_texts():
    files = {f.path: f for f in desired.agent_files("YAML", "UNIT")}
    assert {p: (f.content, f.mode) for p, f in files.items()} == {
        "/etc/llmgw/agent.yaml": (b"YAML", 0o644), "/etc/systemd/system/llmgw-agent.service": (b"UNIT", 0o644)}


def test_files_that_say_the_same_in_other_words_are_equivalent():
    """How an up adopts what onboard-node.sh wrote: same YAML data, same unit directives."""
    want_yaml = desired.render_agent_yaml("gpu-01", AgentSettings(servers=("cp1:7443",)), "gpu-01")
    script_yaml = ('# gpu-01, written by onboard-node.sh.\nserver: "cp1:7443"\n\ntls:\n  ca: /etc/llmgw/ca.pem\n'
                   '  cert: /etc/llmgw/agent.pem\n  key: /etc/llmgw/agent-key.pem\n')
    assert desired.equivalent(desired.Content.AGENT_YAML, script_yaml, want_yaml)
    assert not desired.equivalent(desired.Content.AGENT_YAML, script_yaml.replace("cp1:", "cp2:"), want_yaml)
    assert not desired.equivalent(desired.Content.AGENT_YAML, "server: [unclosed", want_yaml)
    unit = desired.render_unit()
    bare = "\n".join(line for line in unit.splitlines() if not line.startswith("#") and line) + "\n"
    assert bare != unit and desired.equivalent(desired.Content.UNIT, bare, unit)
    assert not desired.equivalent(desired.Content.UNIT, bare.replace("KillMode=process", "KillMode=control-group"), unit)
    assert not desired.equivalent(desired.Content.CA_PEM, "a", "b")
