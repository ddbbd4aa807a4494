"""Each validator accepts the whole of a good value and nothing around it (security review L1 and its survivors)."""

import math
import re

import pytest

from llmgw_pulumi import validate

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE3xKPxu6nJJKFsDdOlnXSh6kp1jpfjf1W6cXBx5OfVZ"

# (validator, values it must accept): each is also tried with a trailing newline and other characters around it.
GOOD = [
    (validate.node_id, ["gpu-01", "a", "0", "n" * 63]),
    (validate.address, ["10.0.0.12", "fd00::11", "fe80::1%eth0", "gpu01.example.net", "localhost"]),
    (validate.server, ["cp1.example.net:7443", "10.0.0.1:1", "[fd00::1]:7443", "[fe80::1%eth0]:65535"]),
    (validate.version, ["v1.4.2", "v1.4.2-3-gabc1234", "dev", "1.0"]),
    (validate.ssh_user, ["deploy", "root", "_svc", "a.b-c"]),
    (validate.hop, ["deploy@bastion.example.net", "deploy@10.0.0.1:2222", "root@fd00::1"]),
    (validate.interface, ["eth0", "bond0", "eth0.100", "eth0:1", "enp1s0f0np0", "_x"]),
    (validate.hca, ["mlx5_0", "mlx5_bond_0", "hfi1_0", "rxe0"]),
    (validate.fabric_name, ["ib-east", "a"]),
    (validate.key_origin, ["node", "operator"]),
    (lambda v: validate.abs_path(v, on_node=True), ["/opt/llama/bin/llama-server", "/", "/opt/my dir/x", "/a/..b/c"]),
    (validate.local_path, ["~/src/llmgw/llmgw", "bin/llmgw", "/abs/llmgw"]),
]
CASES = [(v, good) for v, goods in GOOD for good in goods]
IDS = [f"{getattr(v, '__name__', 'path')}:{good}" for v, good in CASES]


@pytest.mark.parametrize("validator,good", CASES, ids=IDS)
def test_a_good_value_is_accepted(validator, good):
    assert validator(good) is None


@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\r", "\x00", "\x1b[2J", "\u2028", "\x85"])
@pytest.mark.parametrize("validator,good", CASES, ids=IDS)
def test_a_good_value_with_a_line_break_or_control_character_after_it_is_refused(validator, good, suffix):
    problem = validator(good + suffix)
    assert problem is not None, f"{good + suffix!r} was accepted"
    assert all(problem), "a refusal says what is wrong and what to do"


@pytest.mark.parametrize("validator,good", CASES, ids=IDS)
def test_a_newline_before_a_good_value_is_refused(validator, good):
    assert validator("\n" + good) is not None


def test_every_pattern_of_the_module_is_anchored_at_both_ends():
    """`$` matches before a final newline: every pattern is \\A...\\Z, so even .match() tests the whole value."""
    patterns = {name: p for name, p in vars(validate).items() if isinstance(p, re.Pattern)}
    assert {"RELEASE_TAG", "_LABEL", "_HOSTNAME", "_VERSION", "_IFNAME", "_HCA"} <= set(patterns)
    for name, p in patterns.items():
        if name == "_CONTROL":
            continue
        assert p.pattern.startswith(r"\A") and p.pattern.endswith(r"\Z"), name
    assert validate.RELEASE_TAG.match("v1.2.3") and not validate.RELEASE_TAG.match("v1.2.3\n")


# --------------------------------------------------------------------------- path components and arguments

@pytest.mark.parametrize("validator", [validate.interface, validate.hca, validate.node_id, validate.fabric_name],
                         ids=["interface", "hca", "node_id", "fabric_name"])
@pytest.mark.parametrize("bad", ["-x", "--help", ".", "..", ".hidden", "a/b", "a b", ""])
def test_what_would_be_a_file_name_or_an_argument_never_starts_with_a_dash_or_a_dot(validator, bad):
    problem = validator(bad)
    assert problem is not None, f"{bad!r} was accepted"
    assert repr(bad) in problem[0] or problem[0] == "is missing"


def test_the_interface_and_hca_fixes_say_what_a_name_may_start_with():
    for validator in (validate.interface, validate.hca):
        problem = validator("-x")
        assert problem is not None and "not starting with '-' or '.'" in problem[1]


@pytest.mark.parametrize("path", ["/opt/..", "/opt/../bin/x", "/..", "/a/b/../../etc/shadow"])
def test_a_path_with_a_dot_dot_component_is_refused(path):
    """Kills the review's survivor at validate.py:99 (the '..' check disabled)."""
    assert validate.abs_path(path, "engine path", on_node=True) == (f"{path!r} contains '..'", "give the engine path without '..'")


def test_a_relative_path_and_a_path_with_a_newline_are_refused_with_their_own_words():
    assert validate.abs_path("bin/x", "engine path", on_node=True)[0] == "'bin/x' is relative"
    assert validate.abs_path("/opt/x\n", "engine path")[0] == "contains a newline or control character"


@pytest.mark.parametrize("server", ["cp1.example.net:7443\n", "cp1\x1b.example.net:7443", "cp1.example.net:74\x0043",
                                    "[fd00::1]:7443\n", "cp1.example.net:7443\u2028"])
def test_a_server_with_a_control_character_is_refused_as_such(server):
    """Kills the review's survivor at validate.py:68 (the control-character check removed): without it such a
    value is refused, if at all, for the wrong reason."""
    problem = validate.server(server)
    assert problem is not None and "control characters" in problem[0], problem
    assert problem[0].startswith(repr(server)), "the value is shown escaped"


# --------------------------------------------------------------------------- numbers, ports, zones

@pytest.mark.parametrize("port", ["²", "٧٤٤٣", "7_443", " 7443", "+7443", "0x1d13"])
def test_a_server_port_is_ascii_digits_only(port):
    assert validate.server(f"cp1.example.net:{port}") is not None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("validator", [validate.port, validate.ssh_wait, validate.positive_int, validate.hours],
                         ids=["port", "ssh_wait", "positive_int", "hours"])
def test_nan_and_infinity_are_not_numbers_here(validator, value):
    """YAML's .nan and .inf arrive as floats: refused, never a crash or a wait of NaN seconds."""
    assert validator(value) is not None


def test_a_huge_whole_number_is_out_of_range_not_a_crash():
    assert validate.port(10**400) is not None and validate.ssh_wait(10**400) is not None


@pytest.mark.parametrize("address", ["fe80::1%", "fe80::1%eth0/x", "fe80::1%-x", "fe80::1%eth0 ; id", "10.0.0.1%eth0x"])
def test_an_ipv6_zone_is_an_interface_name_or_nothing(address):
    assert validate.address(address) is not None
    assert validate.server(f"[{address}]:7443") is not None


@pytest.mark.parametrize("hop", ["deploy@bastion:22\n", "deploy@bastion: 22", "deploy@bastion:2_2", "deploy@bastion:٢٢",
                                 "deploy@bastion:", "deploy@bas\ntion"])
def test_a_jump_host_with_a_bad_port_or_a_line_break_is_refused(hop):
    assert validate.hop(hop) is not None


def test_a_host_key_with_a_control_character_is_refused_but_whitespace_only_separates_its_words():
    assert validate.host_key(HOST_KEY) is None
    for pasted in (HOST_KEY + "\n", HOST_KEY + "\top@laptop\r\n", HOST_KEY.replace(" ", "\n")):
        assert validate.host_key(pasted) is None, "a pasted .pub line: the pin is normalised"
        assert validate.normalise_host_key(pasted) == HOST_KEY
    for bad in (HOST_KEY + " op\x1b[2J", HOST_KEY + " op\x00", HOST_KEY + "\u202e"):
        problem = validate.host_key(bad)
        assert problem is not None and "control character" in problem[0], bad
