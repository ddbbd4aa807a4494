"""What each validator says, word for word: the problem and the fix an operator reads, for each way a value can be
wrong; and the values at each bound. (test_validate.py covers what must be refused at all; this covers what is said.)
Every expected text is written out here, never taken from llmgw_pulumi.validate."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_pulumi import validate

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE3xKPxu6nJJKFsDdOlnXSh6kp1jpfjf1W6cXBx5OfVZ"
URL_EXAMPLE = "e.g. https://releases.example.net/llmgw"
PASTE = ("paste the node's /etc/ssh/ssh_host_ed25519_key.pub (a trailing comment is dropped), "
         "or a known_hosts line without the host: 'ssh-ed25519 AAAAC3...'")
HOP_FIX = "write a jump host as user@host or user@host:port, e.g. deploy@bastion.example.net"
LABEL_FIX = "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"

SAID: list[tuple[Any, object, tuple[str, str]]] = [
    (validate.node_id, "", ("is missing", "give every node an id, e.g. id: gpu-node-01")),
    (validate.node_id, "GPU", ("'GPU' is not a valid DNS label", LABEL_FIX)),
    (validate.address, None, ("is missing", "give the node's IP address or DNS name")),
    (validate.address, 7, ("is missing", "give the node's IP address or DNS name")),
    (validate.address, "fe80::1%eth0%1", ("'fe80::1%eth0%1' is not an IP address or a DNS name",
                                          "write e.g. 10.0.0.12 or gpu01.example.net, on one line")),
    (validate.address, "a b", ("'a b' is not an IP address or a DNS name", "write e.g. 10.0.0.12 or gpu01.example.net")),
    (validate.address, "a\nb", ("'a\\nb' is not an IP address or a DNS name",
                                "write e.g. 10.0.0.12 or gpu01.example.net, on one line")),
    (validate.port, 0, ("0 is not a TCP port", "use a whole number from 1 to 65535")),
    (validate.server, " ", ("is empty", "write each control plane as host:port, e.g. cp1.example.net:7443")),
    (validate.server, "cp1 :7443", ("'cp1 :7443' contains spaces, quotes or control characters",
                                    "write it as host:port, on one line")),
    (validate.server, "cp'1:7443", ('"cp\'1:7443" contains spaces, quotes or control characters',
                                    "write it as host:port, on one line")),
    (validate.server, 'cp"1:7443', ("'cp\"1:7443' contains spaces, quotes or control characters",
                                    "write it as host:port, on one line")),
    (validate.server, "cp1", ("'cp1' has no port", "add the control plane's port, e.g. cp1:7443")),
    (validate.server, ":7443", ("':7443' has no host",
                                "write the control plane's address before its port, e.g. cp1.example.net:7443")),
    (validate.server, "a:b:7443", ("'a:b:7443': host 'a:b' is not an IP address or a DNS name", "write it as host:port")),
    (validate.server, "cp1:65536", ("'cp1:65536' has no valid port", "the port must be a number from 1 to 65535")),
    (validate.server, "[fd00::1]:x1", ("'[fd00::1]:x1' has no valid port", "the port must be a number from 1 to 65535")),
    (validate.server, "[fd00::1]]:7443", ("'[fd00::1]]:7443' is not [ipv6]:port", "write an IPv6 server as [addr]:port")),
    (validate.server, "[fd00::1]7443", ("'[fd00::1]7443' is not [ipv6]:port", "write an IPv6 server as [addr]:port")),
    (validate.server, "[fd00::g]:7443", ("'fd00::g' is not an IPv6 address", "write an IPv6 server as [addr]:port")),
    (validate.server, "-x:7443", ("'-x:7443': host '-x' is not an IP address or a DNS name", "write it as host:port")),
    (validate.server, "cp1:0", ("'cp1:0' has no valid port", "the port must be a number from 1 to 65535")),
    (validate.abs_path, "", ("is empty", "give the absolute path")),
    (validate.abs_path, "a/b", ("'a/b' is relative", "give the absolute path, starting with /")),
    (validate.abs_path, "/a/../b", ("'/a/../b' contains '..'", "give the path without '..'")),
    (validate.abs_path, "/a\tb", ("contains a newline or control character",
                                  "give the path on one line, in printable characters")),
    (validate.local_path, "", ("is empty", "give the path")),
    (validate.local_path, "a\nb", ("contains a newline or control character",
                                   "give the path on one line, in printable characters")),
    (validate.version, "", ("is missing", "give a release tag such as v1.4.2, or a local binary")),
    (validate.version, "-v1", ("'-v1' is not a version",
                               "use a release tag vX.Y.Z, or a dev version such as v1.4.2-3-gabc1234")),
    (validate.version, "v1.4", ("'v1.4' is a malformed release tag", "release tags have exactly three numbers: vX.Y.Z")),
    (validate.url, "", ("is missing", f"give the release archive's base URL, {URL_EXAMPLE}")),
    (validate.url, "https://r.example/a b", ("contains spaces or control characters", f"give a plain https URL, {URL_EXAMPLE}")),
    (validate.url, "https://r.example/\x1b", ("contains spaces or control characters", f"give a plain https URL, {URL_EXAMPLE}")),
    (validate.url, "http://r.example", ("'http://r.example' is plain http: anyone on the path could serve another "
                                        "checksums.txt or binary",
                                        f"serve the releases over https (agent.releaseCa for a private CA), {URL_EXAMPLE}")),
    (validate.url, "ftp://r.example", ("'ftp://r.example' is not an https URL",
                                       f"give the release archive's base URL, {URL_EXAMPLE}")),
    (validate.url, "https:///llmgw", ("'https:///llmgw' is not an https URL",
                                      f"give the release archive's base URL, {URL_EXAMPLE}")),
    (validate.url, "https://u:p@r.example", (
        "has credentials in it (user:password@): they would be shown in logs, state and the nodes' process lists",
        "remove them: serve the releases to the machines that need them without a login in the URL (or use "
        "agent.fetch: operator)")),
    (validate.url, "https://r.example/?a=1", ("'https://r.example/?a=1' has a query or fragment",
                                              "give the base URL only; <tag>/<file> is appended to it")),
    (validate.url, "https://r.example/#top", ("'https://r.example/#top' has a query or fragment",
                                              "give the base URL only; <tag>/<file> is appended to it")),
    (validate.url, "https://r.example:x/", ("'https://r.example:x/' has a port that is not a number from 0 to 65535",
                                            f"fix the port, {URL_EXAMPLE}")),
    (validate.ssh_wait, "5", ("'5' is not a number of seconds", "give the SSH wait in seconds, e.g. 120")),
    (validate.ssh_wait, -1, ("-1 is out of range", "give 0 to 3600 seconds")),
    (validate.ssh_user, "Root", ("'Root' is not a user name", "give the login user on the node, e.g. deploy or root")),
    (validate.host_key, "ssh-ed25519\x1bAAAA", ("contains a control character",
                                               "paste the node's host key as its .pub file has it: 'ssh-ed25519 AAAAC3...'")),
    (validate.host_key, "ssh-ed25519", ("is not an SSH public key", PASTE)),
    (validate.host_key, "ssh-dss AAAAB3NzaC1kc3M=", ("is not an SSH public key", PASTE)),
    (validate.host_key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA", ("is not an SSH public key", PASTE)),
    (validate.host_key, 7, ("is not an SSH public key", PASTE)),
    (validate.hop, "bastion", ("'bastion' is not user@host[:port]", HOP_FIX)),
    (validate.hop, 7, ("7 is not user@host[:port]", HOP_FIX)),
    (validate.hop, "deploy@bastion:2x", ("'deploy@bastion:2x' has a port that is not a number", HOP_FIX)),
    (validate.hop, "a@b:1@bastion", ("'a@b:1@bastion' has a port that is not a number", HOP_FIX)),
    (validate.hop, "Deploy@bastion", ("'Deploy@bastion': 'Deploy' is not a user name", HOP_FIX)),
    (validate.hop, "deploy@-b", ("'deploy@-b': '-b' is not an IP address or a DNS name", HOP_FIX)),
    (validate.hop, "deploy@bastion:0", ("'deploy@bastion:0': 0 is not a TCP port", HOP_FIX)),
    (validate.boolean, "true", ("'true' is not true or false", "write true or false, without quotes")),
    (validate.interface, 7, ("7 is not a network interface name",
                             "give an interface name such as eth0 or bond0: up to 15 letters, digits, '_', '.', ':' or "
                             "'-', not starting with '-' or '.'")),
    (validate.fabric_name, "IB", ("'IB' is not a fabric name",
                                  "name the fabric with lowercase letters, digits and '-', e.g. ib-east")),
    (validate.positive_int, 0, ("0 is not a whole number above 0", "give how many agents may restart at once, e.g. 2")),
    (validate.positive_int, 1.5, ("1.5 is not a whole number above 0", "give how many agents may restart at once, e.g. 2")),
    (validate.hours, 0, ("0 is not a number of hours above 0 and at most 87600", "give a duration in hours, e.g. 8760 for a year")),
]


@pytest.mark.parametrize("validator, value, said", SAID, ids=[f"{v.__name__}-{i}" for i, (v, _, _) in enumerate(SAID)])
def test_each_refusal_says_what_is_wrong_and_what_to_write(validator: Any, value: object, said: tuple[str, str]) -> None:
    assert validator(value) == said


def test_the_fix_names_what_the_path_is_and_where() -> None:
    assert validate.abs_path("", "engine binary") == ("is empty", "give the absolute engine binary")
    assert validate.abs_path("x", "engine binary", on_node=True) == (
        "'x' is relative", "give the absolute engine binary on the node, starting with /")
    assert validate.local_path("", "binary") == ("is empty", "give the binary")


@pytest.mark.parametrize("validator, accepted, refused", [
    (validate.positive_int, [1, 2, 1.0, 10**6], [0, -1, 0.5, True, "1"]),
    (validate.port, [1, 22, 65535, 22.0], [0, 65536, 22.5, False, "22"]),
    (validate.ssh_wait, [0, 0.5, 3600], [-0.1, 3600.5, "1", None]),
    (validate.hours, [0.01, 1, 87600], [0, -1, 87600.01, "1"]),
    (validate.boolean, [True, False], [1, 0, "false", None]),
    (validate.key_origin, ["node", "operator"], ["Node", "nodes", "", None]),
    (validate.hca, ["mlx5_0", "a" * 64], ["a" * 65, "-mlx5", ".x", "a/b", None]),
    (validate.interface, ["eth0", "a" * 15], ["a" * 16, "eth 0", None]),
], ids=["positive_int", "port", "ssh_wait", "hours", "boolean", "key_origin", "hca", "interface"])
def test_each_bound_is_where_it_says(validator: Any, accepted: list[object], refused: list[object]) -> None:
    assert [v for v in accepted if validator(v) is not None] == []
    assert [v for v in refused if validator(v) is None] == []


def test_hours_take_their_upper_bound() -> None:
    assert validate.hours(48, upper=48) is None
    assert validate.hours(48.5, upper=48) == ("48.5 is not a number of hours above 0 and at most 48",
                                              "give a duration in hours, e.g. 8760 for a year")


@pytest.mark.parametrize("hop, parts", [
    ("deploy@bastion", ("deploy", "bastion", 22)),
    ("deploy@bastion:2222", ("deploy", "bastion", 2222)),
    ("deploy@fd00::1", ("deploy", "fd00::1", 22)),
    ("deploy@10.0.0.1:22", ("deploy", "10.0.0.1", 22)),
], ids=["no port", "port", "ipv6", "ipv4 and port"])
def test_a_jump_host_splits_into_user_host_and_port(hop: str, parts: tuple[str, str, int]) -> None:
    assert validate.hop(hop) is None
    assert validate.split_hop(hop) == parts


def test_a_jump_host_with_two_at_signs_is_refused_by_its_user() -> None:
    assert validate.hop("a@b@bastion") == ("'a@b@bastion': 'b@bastion' is not an IP address or a DNS name", HOP_FIX)
    assert validate.split_hop("a@b@bastion:2222") == ("a", "b@bastion", 2222)


def test_a_pinned_host_key_is_normalised_to_type_and_key() -> None:
    assert validate.normalise_host_key(f"  {HOST_KEY}\troot@gpu-01 \n") == HOST_KEY
    assert validate.host_key(f"{HOST_KEY} root@gpu-01\n") is None
    with pytest.raises(ValueError, match=r"^not an SSH public key$"):
        validate.normalise_host_key("ssh-ed25519")


def test_an_unknown_setting_gets_the_nearest_name_or_the_list() -> None:
    assert validate.did_you_mean("pkidir", ["pkiDir", "servers", "pkiDirs"]) == "did you mean pkiDir?"
    assert validate.did_you_mean("zzz", ["servers", "agent"]) == "use one of agent, servers"
