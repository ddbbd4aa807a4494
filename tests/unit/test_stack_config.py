"""Bad stack config is refused before any side effect, naming the node, the field and the fix."""


import pulumi
import pytest

from llmgw_pulumi import boundary, errors
from llmgw_pulumi.config import stack_config
from llmgw_pulumi.config.specs import Fabric
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.errors import ConfigError
from tests.unit.good_configs import DELETE, GOOD, mutate

# (case, path into the config, new value, node named, field named, words the problem must contain)
BAD = [
    ("node id with capitals", ("nodes", 0, "id"), "GPU_01", "nodes[0]", "id", "not a valid DNS label"),
    ("node id with a newline", ("nodes", 0, "id"), "gpu\n01", "nodes[0]", "id", "not a valid DNS label"),
    ("node id with a quote", ("nodes", 0, "id"), 'gpu"01', "nodes[0]", "id", "not a valid DNS label"),
    ("node id with yaml syntax", ("nodes", 0, "id"), "gpu: {x}", "nodes[0]", "id", "not a valid DNS label"),
    ("node id too long", ("nodes", 0, "id"), "a" * 64, "nodes[0]", "id", "not a valid DNS label"),
    ("node id missing", ("nodes", 0, "id"), DELETE, "nodes[0]", "id", "missing"),
    ("servers empty", ("servers",), [], "llmgw", "servers", "empty"),
    ("servers not a list", ("servers",), "cp1:7443", "llmgw", "servers", "not a list of host:port"),
    ("server without a port", ("servers",), ["cp1.example.net"], "llmgw", "servers[0]", "has no port"),
    ("server with a bad port", ("servers",), ["cp1.example.net:99999"], "llmgw", "servers[0]", "no valid port"),
    ("server with spaces", ("servers",), ["cp1 example:7443"], "llmgw", "servers[0]", "spaces"),
    ("server empty string", ("servers",), [""], "llmgw", "servers[0]", "empty"),
    ("node servers empty", ("nodes", 0, "servers"), [], "node gpu-01", "servers", "empty"),
    ("address not an address", ("nodes", 0, "address"), "not an address!", "node gpu-01", "address", "not an IP address"),
    ("address bad ipv4", ("nodes", 0, "address"), "10.0.0.300", "node gpu-01", "address", "not an IP address"),
    ("address missing", ("nodes", 0, "address"), DELETE, "node gpu-01", "address", "missing"),
    ("hcas without a fabric", ("nodes", 1, "fabric"), {"hcas": ["mlx5_0"]}, "node gpu-02", "fabric.name",
     "HCAs were given without a fabric"),
    ("fabric without hcas", ("nodes", 1, "fabric"), {"name": "ib-east"}, "node gpu-02", "fabric.hcas", "a fabric without HCAs"),
    ("fabric with empty hcas", ("nodes", 1, "fabric"), {"name": "ib-east", "hcas": []}, "node gpu-02", "fabric.hcas",
     "a fabric without HCAs"),
    ("bad hca name", ("nodes", 1, "fabric"), {"name": "ib-east", "hcas": ["mlx5 0"]}, "node gpu-02", "fabric.hcas[0]", "not an HCA name"),
    ("relative engine path", ("nodes", 1, "engines"), {"llamacpp": {"bin": "bin/llama-server"}}, "node gpu-02",
     "engines.llamacpp.bin", "is relative"),
    ("engine path with newline", ("nodes", 1, "engines"), {"vllm": {"bin": "/opt/vllm\n/bin"}}, "node gpu-02",
     "engines.vllm.bin", "newline"),
    ("unknown engine", ("nodes", 1, "engines"), {"ollama": {"bin": "/opt/ollama"}}, "node gpu-02", "engines.ollama", "not an engine"),
    ("sglang given a bin", ("nodes", 1, "engines"), {"sglang": {"bin": "/opt/sg"}}, "node gpu-02", "engines.sglang",
     "must be {python: PATH}"),
    ("malformed version tag", ("agent", "version"), "v1.2", "llmgw", "agent.version", "malformed release tag"),
    ("version with spaces", ("agent", "version"), "v1 2 3", "llmgw", "agent.version", "not a version"),
    ("release url not http", ("agent", "releaseUrl"), "ftp://releases.example.net", "llmgw", "agent.releaseUrl", "not an https URL"),
    ("release url missing for a tag", ("agent", "releaseUrl"), DELETE, "llmgw", "agent.releaseUrl", "missing"),
    ("dev version without a binary", ("agent", "version"), "v1.2.3-4-gabc", "llmgw", "agent.binary", "not a release tag"),
    ("negative ssh wait", ("ssh", "wait"), -5, "llmgw", "ssh.wait", "out of range"),
    ("absurd ssh wait", ("ssh", "wait"), 10**7, "llmgw", "ssh.wait", "out of range"),
    ("ssh wait not a number", ("ssh", "wait"), "soon", "llmgw", "ssh.wait", "not a number"),
    ("no ssh key at all", ("ssh", "privateKeyPath"), DELETE, "llmgw", "ssh.privateKeyPath", "missing"),
    ("relative pki dir", ("pkiDir",), "pki", "llmgw", "pkiDir", "relative"),
    ("unknown top-level key", ("sever",), ["x:1"], "llmgw", "sever", "not a setting"),
    ("unknown node key", ("nodes", 0, "adress"), "10.0.0.1", "node gpu-01", "adress", "not a node setting"),
    ("duplicate node id", ("nodes", 1, "id"), "gpu-01", "node gpu-01", "id", "used by nodes[0] too"),
    ("two nodes on the same address", ("nodes", 1, "address"), "10.0.0.11", "node gpu-02", "address", "also the address of node gpu-01"),
    ("mgmt interface too long", ("nodes", 0, "mgmtInterface"), "averyveryverylongifname", "node gpu-01", "mgmtInterface",
     "not a network interface"),
    ("discovery relative", ("nodes", 0, "discovery"), {"nvidiaSmi": "nvidia-smi"}, "node gpu-01", "discovery.nvidiaSmi",
     "relative"),
    ("renewal longer than validity", ("certificate",), {"validityHours": 10, "renewBeforeHours": 20}, "llmgw",
     "certificate.renewBeforeHours", "not shorter"),
    ("bad pinned host key", ("nodes", 0, "hostKey"), "AAAA-not-a-key", "node gpu-01", "hostKey", "not an SSH public key"),
    ("nodes empty", ("nodes",), [], "llmgw", "nodes", "empty"),
    ("bad key origin", ("nodes", 1, "keyOrigin"), "ssh", "node gpu-02", "keyOrigin", "not node or operator"),
    ("bad stack key origin", ("certificate",), {"keyOrigin": "cloud"}, "llmgw", "certificate.keyOrigin", "not node or operator"),
]


def test_the_good_config_parses():
    spec = stack_config.parse(GOOD)
    assert [n.node_id for n in spec.nodes] == ["gpu-01", "gpu-02"]
    assert spec.nodes[1].settings.fabrics == (Fabric("ib-east", ("mlx5_0",)),)
    assert spec.nodes[0].connection.user == "deploy" and spec.nodes[0].settings.servers == ("cp1.example.net:7443",)


def test_the_key_is_made_on_the_node_unless_a_node_or_the_stack_says_operator():
    assert [n.key_origin for n in stack_config.parse(GOOD).nodes] == ["node", "node"]
    one = stack_config.parse(mutate(("nodes", 1, "keyOrigin"), "operator"))
    assert [n.key_origin for n in one.nodes] == ["node", "operator"]
    every = stack_config.parse(mutate(("certificate",), {"keyOrigin": "operator"}))
    assert [n.key_origin for n in every.nodes] == ["operator", "operator"]


@pytest.mark.parametrize("case,path,value,node,field,words", BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_node_field_and_fix(case, path, value, node, field, words):
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(mutate(path, value))
    matching = [p for p in err.value.problems if p[0] == node and p[1] == field]
    assert matching, f"no problem for {node}/{field} in {err.value.problems}"
    _, _, problem, fix = matching[0]
    assert words in problem
    assert fix, "every problem carries a fix"
    assert f"{node}: {field}: " in str(err.value)


def test_paths_with_spaces_are_accepted():
    cfg = mutate(("nodes", 1, "engines"), {"llamacpp": {"bin": "/opt/llama cpp/bin/llama-server"}})
    assert stack_config.parse(cfg).nodes[1].settings.engines["llamacpp"] == "/opt/llama cpp/bin/llama-server"


def test_ipv6_server_and_address_are_accepted():
    cfg = mutate(("servers",), ["[fd00::1]:7443"])
    cfg["nodes"][0]["address"] = "fd00::11"
    assert stack_config.parse(cfg).nodes[0].connection.host == "fd00::11"


def test_every_problem_is_reported_at_once():
    cfg = mutate(("servers",), [])
    cfg["nodes"][0]["id"] = "Bad_Id"
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(cfg)
    fields = {p[1] for p in err.value.problems}
    assert {"servers", "id"} <= fields


# (case, path into the config, misspelled key's value, node named, field named, the fix)
MISSPELLED = [
    ("top level", ("sever",), ["cp1.example.net:7443"], "llmgw", "sever", "did you mean servers?"),
    ("top level, case", ("PkiDir",), "/srv/llmgw/pki", "llmgw", "PkiDir", "did you mean pkiDir?"),
    ("ssh", ("ssh", "wiat"), 30, "llmgw", "ssh.wiat", "did you mean wait?"),
    ("ssh key path", ("ssh", "privateKeyFile"), "/k", "llmgw", "ssh.privateKeyFile", "did you mean privateKeyPath?"),
    ("agent", ("agent", "releaseURL"), "https://x.example.net", "llmgw", "agent.releaseURL", "did you mean releaseUrl?"),
    ("certificate", ("certificate",), {"validityHour": 10}, "llmgw", "certificate.validityHour", "did you mean validityHours?"),
    ("node", ("nodes", 0, "adress"), "10.0.0.1", "node gpu-01", "adress", "did you mean address?"),
    ("node host key", ("nodes", 0, "hostkey"), "x", "node gpu-01", "hostkey", "did you mean hostKey?"),
    ("node agent", ("nodes", 0, "agent"), {"version": "v1.5.0", "verison": "v1"}, "node gpu-01", "agent.verison", "did you mean version?"),
    ("fabric", ("nodes", 1, "fabric"), {"name": "ib-east", "hcas": ["mlx5_0"], "hca": ["mlx5_1"]},
     "node gpu-02", "fabric.hca", "did you mean hcas?"),
    ("fabrics", ("nodes", 1, "fabrics"), [{"name": "ib-east", "hcas": ["mlx5_0"], "nme": "x"}],
     "node gpu-02", "fabrics[0].nme", "did you mean name?"),
    ("discovery", ("nodes", 0, "discovery"), {"nvidiaSMI": "/usr/bin/nvidia-smi"}, "node gpu-01", "discovery.nvidiaSMI",
     "did you mean nvidiaSmi?"),
    ("nothing close", ("zzz",), 1, "llmgw", "zzz", "use one of agent, caKey, caKeyPassphrase, certificate, "
                                                     "failOnEngineProblems, failOnProblems, hardware, inventory, nodes, "
                                                     "pkiDir, registration, rollout, servers, signer, ssh, sshKeyPassphrase, "
                                                     "sshPrivateKey"),
]


@pytest.mark.parametrize("case,path,value,node,field,fix", MISSPELLED, ids=[m[0] for m in MISSPELLED])
def test_a_misspelled_key_is_refused_with_the_nearest_valid_one(case, path, value, node, field, fix):
    cfg = mutate(path, value)
    if path == ("nodes", 1, "fabrics"):
        del cfg["nodes"][1]["fabric"]
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(cfg)
    matching = [p for p in err.value.problems if p[:2] == (node, field)]
    assert len(matching) == 1, err.value.problems
    assert matching[0][2].startswith("is not a") and matching[0][3] == fix


def test_the_problems_print_as_a_clean_list():
    cfg = mutate(("nodes", 0, "address"), "10.0.0.300")
    cfg["sever"] = ["cp2.example.net:7443"]
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(cfg)
    assert str(err.value) == (
        "stack config has 2 problems:\n"
        "  llmgw: sever: is not a setting of this project\n"
        "    fix: did you mean servers?\n"
        "  node gpu-01: address: '10.0.0.300' is not an IP address or a DNS name\n"
        "    fix: write e.g. 10.0.0.12 or gpu01.example.net"
    )


def test_one_problem_is_one_problem():
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(mutate(("ssh", "wait"), -1))
    assert str(err.value).splitlines()[0] == "stack config has 1 problem:"


def test_config_errors_are_what_the_python_language_host_prints_without_a_traceback():
    # pulumi-language-python-exec: `except pulumi.RunError as e: pulumi.log.error(str(e))`;
    # any other exception is printed with "Program failed with an unhandled exception:" and its traceback.
    # The error is plain Python where it is raised; where it reaches the SDK, it is a RunError too.
    with pytest.raises(StackConfigError) as plain:
        stack_config.parse(mutate(("sever",), []))
    assert not isinstance(plain.value, pulumi.RunError)
    with pytest.raises(pulumi.RunError) as err, boundary.pulumi_errors():
        stack_config.parse(mutate(("sever",), []))
    assert isinstance(err.value, StackConfigError)
    assert type(err.value).__name__ == "StackConfigError" and type(err.value).__module__ == "llmgw_pulumi.errors"
    assert (str(err.value), err.value.problems, err.value.field) == (str(plain.value), plain.value.problems, "llmgw:*")
    assert "Traceback" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_only_config_errors_become_run_errors_at_the_boundary():
    with pytest.raises(ConfigError) as err, boundary.pulumi_errors():
        raise ConfigError("gpu-01", "ssh.wait", "is out of range", "give 0 to 3600 seconds")
    assert isinstance(err.value, pulumi.RunError)
    assert (err.value.node, err.value.field, err.value.fix) == ("gpu-01", "ssh.wait", "give 0 to 3600 seconds")
    with pytest.raises(errors.UnreachableError) as other, boundary.pulumi_errors():
        raise errors.UnreachableError("gpu-01", "no answer")
    assert not isinstance(other.value, pulumi.RunError)


def test_a_secret_other_than_the_ssh_key_is_named_not_read():
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(GOOD, secret_keys=["servers", "sshPrivatKey"])
    problems = {p[1]: p for p in err.value.problems}
    assert problems["servers"][2] == (
        "is set as a secret, but only sshPrivateKey, sshKeyPassphrase, caKeyPassphrase and caKey are read as secrets")
    assert problems["sshPrivatKey"][3] == "did you mean sshPrivateKey?"


def test_paths_on_the_operators_machine_are_not_called_paths_on_the_node():
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(mutate(("pkiDir",), "pki"))
    (fix,) = [p[3] for p in err.value.problems if p[1] == "pkiDir"]
    assert "on the node" not in fix and fix.startswith("give the absolute PKI directory")
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(mutate(("nodes", 0, "discovery"), {"nvidiaSmi": "bin/nvidia-smi"}))
    (fix,) = [p[3] for p in err.value.problems if p[1] == "discovery.nvidiaSmi"]
    assert "on the node" in fix


def test_a_setting_held_as_a_secret_is_not_also_called_missing():
    cfg = {k: v for k, v in GOOD.items() if k not in ("pkiDir", "ssh", "nodes")}
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(cfg, secret_keys=["pkiDir", "ssh", "nodes"])
    assert [p[1:3] for p in err.value.problems] == [
        ("pkiDir", "is set as a secret, but only sshPrivateKey, sshKeyPassphrase, caKeyPassphrase and caKey are read as secrets"),
        ("ssh", "is set as a secret, but only sshPrivateKey, sshKeyPassphrase, caKeyPassphrase and caKey are read as secrets"),
        ("nodes", "is set as a secret, but only sshPrivateKey, sshKeyPassphrase, caKeyPassphrase and caKey are read as secrets"),
    ]


def test_rollout_is_parsed_and_a_single_canary_may_be_one_id():
    cfg = mutate(("rollout",), {"maxParallel": 2, "canary": "gpu-01"})
    rollout = stack_config.parse(cfg).rollout
    assert rollout is not None and (rollout.max_parallel, rollout.canaries) == (2, ("gpu-01",))
    assert stack_config.parse(mutate(("rollout",), {"canary": ["gpu-01"]})).rollout.max_parallel is None
    assert stack_config.parse(GOOD).rollout is None


@pytest.mark.parametrize("rollout,field,words", [
    ({"maxParallel": 0}, "rollout.maxParallel", "0 is not a whole number above 0"),
    ({"maxParallel": 1.5}, "rollout.maxParallel", "1.5 is not a whole number above 0"),
    ({"maxParallel": True}, "rollout.maxParallel", "True is not a whole number above 0"),
    ({"canary": ["gpu-99"]}, "rollout.canary", "'gpu-99' is not a node of this stack"),
    ({"canary": ["gpu-01", "gpu-01"]}, "rollout.canary", "lists a node twice"),
    ({"canary": {"id": "gpu-01"}}, "rollout.canary", "is a mapping, not a list of node ids (the nodes to update first)"),
    ({"canarys": ["gpu-01"]}, "rollout.canarys", "is not a rollout setting"),
])
def test_bad_rollout_names_the_field_and_the_fix(rollout, field, words):
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(mutate(("rollout",), rollout))
    (problem,) = err.value.problems
    assert problem[:2] == ("llmgw", field) and problem[2] == words and problem[3], problem
    if "gpu-99" in words:
        assert "llmgw:rollout.canary" in problem[3] and "did you mean gpu-0" in problem[3]
