"""A newline or control character smuggled into any text setting is refused before any side effect, with the
node and the field named: by the stack config reader, and by each provider's check() (which runs first in every
preview and up, and is all a program that builds its nodes itself goes through)."""


import pytest

from llmgw_pulumi.config import stack_config
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from llmgw_pulumi.text import printable
from tests.unit import fake_pem, with_value

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE3xKPxu6nJJKFsDdOlnXSh6kp1jpfjf1W6cXBx5OfVZ"

# Every text setting of the stack config, with a good value.
FULL = {
    "pkiDir": "/srv/llmgw/pki",
    "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "allowUnverifiedRelease": True, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "~/.ssh/id_ed25519", "jump": "deploy@bastion.example.net"},
    "certificate": {"keyOrigin": "node"},
    "rollout": {"canary": ["gpu-01"]},
    "nodes": [
        {"id": "gpu-01", "address": "10.0.0.11", "user": "deploy", "hostKey": HOST_KEY, "mgmtAddr": "10.1.0.11",
         "mgmtInterface": "eth1", "fabric": {"name": "ib-east", "hcas": ["mlx5_0"]},
         "engines": {"llamacpp": {"bin": "/opt/llama/bin/llama-server"}, "vllm": {"bin": "/opt/vllm/bin/vllm"},
                     "sglang": {"python": "/opt/sglang/bin/python"}},
         "discovery": {"nvidiaSmi": "/opt/nvidia/bin/nvidia-smi", "ibRoot": "/sys/class/infiniband"},
         "keyOrigin": "operator", "jump": [{"address": "deploy@bastion2.example.net", "hostKey": HOST_KEY}],
         "servers": ["cp2.example.net:7443"], "agent": {"version": "v1.5.0"}},
        {"id": "gpu-02", "address": "gpu-02.example.net", "agent": {"binary": "~/src/llmgw/llmgw"}},
    ],
}


def text_settings(value, path=()):
    """(path, value) of every string in the config."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from text_settings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from text_settings(v, (*path, i))


def field_of(path):
    """The field a problem names for ``path``: dotted keys, [i] for list items, without the node's place."""
    if path[0] == "nodes":
        path = path[2:]
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return {"jump[0].hostKey": "jump[0].host_key", "ssh.jump": "ssh.jump[0].address"}.get(out, out)


def node_of(path, cfg):
    if path[0] != "nodes":
        return "llmgw"
    return f"nodes[{path[1]}]" if path[2:] == ("id",) else f"node {cfg['nodes'][path[1]]['id']}"


SETTINGS = list(text_settings(FULL))
SMUGGLED = {
    "trailing newline": lambda v: v + "\n",
    "newline inside": lambda v: v[:2] + "\n" + v[2:],
    "escape sequence": lambda v: v[:2] + "\x1b[2J" + v[2:],
    "carriage return": lambda v: v + "\r",
    "NUL": lambda v: v[:1] + "\x00" + v[1:],
    "line separator": lambda v: v + "\u2028",
}
def test_the_full_config_parses_and_every_text_setting_is_tried():
    spec = stack_config.parse(FULL)
    assert [n.node_id for n in spec.nodes] == ["gpu-01", "gpu-02"]
    assert len(SETTINGS) == 30


@pytest.mark.parametrize("how", SMUGGLED)
@pytest.mark.parametrize("path", [p for p, _ in SETTINGS], ids=[".".join(map(str, p)) for p, _ in SETTINGS])
def test_a_control_character_in_any_text_setting_is_refused_naming_node_and_field(path, how):
    cfg = with_value(FULL, path, SMUGGLED[how](dict(SETTINGS)[path]))
    try:
        spec = stack_config.parse(cfg)
    except StackConfigError as exc:
        err = exc
    else:
        # Whitespace only separates a host key's words (a pasted .pub line): the pin is normalised, never used as given.
        assert path[-1] == "hostKey" and how != "escape sequence" and how != "NUL", f"{cfg} was accepted"
        node = spec.nodes[0].connection
        assert (node.jump[0].host_key if "jump" in path else node.host_key) == HOST_KEY
        return
    named = [(node, field) for node, field, _, _ in err.problems]
    assert (node_of(path, cfg), field_of(path)) in named, named
    for _, _, problem, fix in err.problems:
        assert problem.isprintable() and fix, "the value is shown escaped, with a fix"
    assert str(err).replace("\n", "").isprintable()


# --------------------------------------------------------------------------- the same through the providers' check()

CONN = {"host": "10.0.0.11", "user": "deploy", "port": 22.0, "wait": 120.0,
        "private_key": fake_pem("OPENSSH PRIVATE KEY", "SSHKEYBODY")}
PEMS = {"ca_pem": "-----BEGIN CERTIFICATE-----\nCA\n", "cert_pem": "-----BEGIN CERTIFICATE-----\nC\n"}
AGENT = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "hostname": "gpu-01",
         "servers": ["cp1:7443"], "version": "v1.2.3", "release_url": "https://r.example/llmgw",
         "mgmt_addr": "10.1.0.11", "mgmt_interface": "eth1", "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0"]}],
         "discovery": {"nvidia_smi": "/opt/nvidia/bin/nvidia-smi", "ib_root": "/sys/class/infiniband"},
         "engines": {"vllm": {"bin": "/opt/vllm/bin/vllm"}}}
ENGINES = {"node_id": "gpu-01", "connection": CONN, "engines": {"vllm": {"bin": "/opt/vllm/bin/vllm"}},
           "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0"]}], "discovery": {"nvidia_smi": "/opt/nvidia/bin/nvidia-smi"}}
IDENTITY = {"node_id": "gpu-01", "connection": CONN, "key_origin": "node", **PEMS}
CERTIFICATE = {"node_id": "gpu-01", "pki_dir": "/srv/llmgw/pki", "key_origin": "node", "connection": CONN}

# (provider, good inputs, path to a text input, the field its failure names)
INPUTS = [
    (AgentInstallProvider, AGENT, ("node_id",), "node_id"),
    (AgentInstallProvider, AGENT, ("servers", 0), "servers[0]"),
    (AgentInstallProvider, AGENT, ("version",), "version"),
    (AgentInstallProvider, AGENT, ("mgmt_addr",), "mgmt_addr"),
    (AgentInstallProvider, AGENT, ("mgmt_interface",), "mgmt_interface"),
    (AgentInstallProvider, AGENT, ("fabrics", 0, "name"), "fabrics[0].name"),
    (AgentInstallProvider, AGENT, ("fabrics", 0, "hcas", 0), "fabrics[0].hcas[0]"),
    (AgentInstallProvider, AGENT, ("discovery", "nvidia_smi"), "discovery.nvidia_smi"),
    (AgentInstallProvider, AGENT, ("discovery", "ib_root"), "discovery.ib_root"),
    (AgentInstallProvider, AGENT, ("engines", "vllm", "bin"), "engines.vllm.bin"),
    (AgentInstallProvider, AGENT, ("connection", "host"), "connection.host"),
    (AgentInstallProvider, AGENT, ("connection", "user"), "connection.user"),
    (EngineCheckProvider, ENGINES, ("engines", "vllm", "bin"), "engines.vllm.bin"),
    (EngineCheckProvider, ENGINES, ("fabrics", 0, "hcas", 0), "fabrics[0].hcas[0]"),
    (EngineCheckProvider, ENGINES, ("discovery", "nvidia_smi"), "discovery.nvidia_smi"),
    (EngineCheckProvider, ENGINES, ("node_id",), "node_id"),
    (NodeIdentityProvider, IDENTITY, ("node_id",), "node_id"),
    (NodeIdentityProvider, IDENTITY, ("connection", "host"), "connection.host"),
    (NodeIdentityProvider, IDENTITY, ("key_origin",), "key_origin"),
    (ClientCertificateProvider, CERTIFICATE, ("node_id",), "node_id"),
    (ClientCertificateProvider, CERTIFICATE, ("pki_dir",), "pki_dir"),
    (ClientCertificateProvider, CERTIFICATE, ("connection", "host"), "connection.host"),
]


def get(props, path):
    for part in path:
        props = props[part]
    return props


@pytest.mark.parametrize("provider,good", [(AgentInstallProvider, AGENT), (EngineCheckProvider, ENGINES),
                                           (NodeIdentityProvider, IDENTITY), (ClientCertificateProvider, CERTIFICATE)])
def test_the_good_inputs_pass_check(provider, good):
    assert provider().check({}, good).failures == []


@pytest.mark.parametrize("how", ["trailing newline", "escape sequence", "NUL"])
@pytest.mark.parametrize("provider,good,path,field", INPUTS, ids=[f"{p.__name__}:{f}" for p, _, _, f in INPUTS])
def test_check_refuses_a_control_character_in_any_text_input_naming_the_field(provider, good, path, field, how):
    news = with_value(good, path, SMUGGLED[how](get(good, path)))
    failures = provider().check({}, news).failures
    assert failures, f"{field} accepted {get(news, path)!r}"
    reasons = [f.reason for f in failures]
    node = printable(news["node_id"])
    assert any(r.startswith(f"{node}: {field}: ") for r in reasons), reasons
    assert all(f.property == "" for f in failures), "never a property name: the engine would print the value"
    assert all(r.isprintable() for r in reasons)
