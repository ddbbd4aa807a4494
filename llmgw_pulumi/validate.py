"""Validation of single values, shared by the stack-config reader and providers' check().

Each validator returns ``None`` when the value is acceptable, or a
``(problem, fix)`` pair that names what is wrong and what to write instead.
They never echo secret values, and they never touch the network or the disk.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Iterable
from typing import TypeGuard
from urllib.parse import urlsplit

Problem = tuple[str, str] | None

# Every pattern is anchored with \A and \Z, and used with fullmatch: `$` would match before a final
# newline, so "gpu-01\n" would pass for gpu-01 (and RELEASE_TAG.match() is used as a whole-value test
# outside this module too).
# RFC 1123 label: what a hostname component, a systemd-friendly id and a
# certificate CN can all safely be.
_LABEL = re.compile(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_HOSTNAME = re.compile(r"\A(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")
RELEASE_TAG = re.compile(r"\Av[0-9]+\.[0-9]+\.[0-9]+\Z")
_VERSION = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.+_-]{0,127}\Z")
_SHORT_TAG = re.compile(r"\Av[0-9]+(\.[0-9]+)?\Z")
# An interface or HCA name is a file name (under /sys/class/net, /sys/class/infiniband) and may become a
# command's argument: it never starts with '-' or '.' (so it is never '.' or '..'), and holds no '/'.
_IFNAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.:-]{0,14}\Z")
_HCA = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_SSH_USER = re.compile(r"\A[a-z_][a-z0-9_.-]{0,31}\Z")
_PORT = re.compile(r"\A[0-9]{1,5}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
"""Control characters (C0, DEL, C1), line and paragraph separators, zero-width and bidirectional marks."""
HOST_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
"""Host-key types a pin may have, and how many strings their public key blob holds (RFC 4253, 5656, 8709)."""

MAX_SSH_WAIT = 3600.0


def _unprintable(value: str) -> bool:
    """Holds a newline, a control character or another character a terminal does not show as itself
    (``str.isprintable``: a tab, an escape, a bidirectional override, a non-breaking space...)."""
    return not value.isprintable()


def _number(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool (YAML gives .nan and .inf as floats)."""
    return not isinstance(value, bool) and (isinstance(value, int) or isinstance(value, float) and math.isfinite(value))


def _scope_ok(value: str) -> bool:
    """An IPv6 zone ('fe80::1%eth0') is an interface name or number: ipaddress takes any text after the '%'."""
    _, sep, zone = value.partition("%")
    return not sep or bool(_IFNAME.fullmatch(zone))


def node_id(value: object) -> Problem:
    if not isinstance(value, str) or not value:
        return "is missing", "give every node an id, e.g. id: gpu-node-01"
    if not _LABEL.fullmatch(value):
        return (
            f"{value!r} is not a valid DNS label",
            "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )
    return None


def address(value: object) -> Problem:
    """An IP address or DNS name that SSH (or the agent) can connect to."""
    if not isinstance(value, str) or not value:
        return "is missing", "give the node's IP address or DNS name"
    if _unprintable(value) or not _scope_ok(value):
        return f"{value!r} is not an IP address or a DNS name", "write e.g. 10.0.0.12 or gpu01.example.net, on one line"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if _HOSTNAME.fullmatch(value) and not re.fullmatch(r"[0-9.]+", value):
        return None
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host and _PORT.fullmatch(port_text) and address(host) is None:
        return (f"{value!r} holds a port: an address is a host alone",
                f"give the address as {host}, without a port (a node's SSH port is its own setting, port)")
    return f"{value!r} is not an IP address or a DNS name", "write e.g. 10.0.0.12 or gpu01.example.net"


def _is_ipv6(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return _scope_ok(value)


def port(value: object) -> Problem:
    if not _number(value) or value != int(value) or not 1 <= value <= 65535:
        return f"{value!r} is not a TCP port", "use a whole number from 1 to 65535"
    return None


def server(value: object) -> Problem:
    """A control-plane address: host:port, [v6]:port."""
    if not isinstance(value, str) or not value.strip():
        return "is empty", "write each control plane as host:port, e.g. cp1.example.net:7443"
    if _unprintable(value) or " " in value or '"' in value or "'" in value:
        return f"{value!r} contains spaces, quotes or control characters", "write it as host:port, on one line"
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return f"{value!r} is not [ipv6]:port", "write an IPv6 server as [addr]:port"
        portpart = rest[1:]
        try:
            ipaddress.IPv6Address(host)
            if not _scope_ok(host):
                raise ValueError(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address", "write an IPv6 server as [addr]:port"
    else:
        host, sep, portpart = value.rpartition(":")
        if _is_ipv6(value) or _is_ipv6(host):
            # '2001:db8::10:7443' is itself an IPv6 address: which colon starts the port cannot be told.
            bracketed = f"[{host}]:{portpart}" if _is_ipv6(host) and _PORT.fullmatch(portpart) else f"[{value}]:7443"
            return (f"{value!r} is an IPv6 address without brackets: its port cannot be told from the address",
                    f"write it in brackets, as {bracketed}")
        if not sep:
            return f"{value!r} has no port", f"add the control plane's port, e.g. {value}:7443"
        if not host:
            return f"{value!r} has no host", "write the control plane's address before its port, e.g. cp1.example.net:7443"
        bad = address(host)
        if bad:
            return f"{value!r}: host {bad[0]}", "write it as host:port"
    if not _PORT.fullmatch(portpart) or not 1 <= int(portpart) <= 65535:
        return f"{value!r} has no valid port", "the port must be a number from 1 to 65535"
    return None


def abs_path(value: object, what: str = "path", on_node: bool = False) -> Problem:
    """An absolute path; ``on_node``: it is a path on the node, not on the machine running Pulumi."""
    if not isinstance(value, str) or not value:
        return "is empty", f"give the absolute {what}"
    if _unprintable(value):
        return "contains a newline or control character", f"give the {what} on one line, in printable characters"
    if not value.startswith("/"):
        return f"{value!r} is relative", f"give the absolute {what}" + (" on the node" if on_node else "") + ", starting with /"
    if ".." in value.split("/"):
        return f"{value!r} contains '..'", f"give the {what} without '..'"
    return None


HOME_PREFIX = "~/"
"""How a path on the machine running Pulumi names the home directory of whoever runs it (``~/.ssh/id_fleet``)."""


def operator_path(value: object, what: str = "path") -> Problem:
    """A path on the machine running Pulumi, recorded as written: absolute, or under the home directory of whoever
    runs Pulumi (``~/...``), so that one stack file reads the same from every operator's machine."""
    if isinstance(value, str) and value.startswith(HOME_PREFIX):
        found = abs_path(value[len(HOME_PREFIX) - 1:], what)
        if found is not None:
            return found[0].replace(repr(value[len(HOME_PREFIX) - 1:]), repr(value)), found[1]
        return None
    found = abs_path(value, what)
    if found is not None and isinstance(value, str) and value and not value.startswith("/"):
        return found[0], f"give the absolute {what}, starting with / or ~/"
    return found


def local_path(value: object, what: str = "path") -> Problem:
    """A path on the machine running Pulumi, as the operator writes it (relative, or with ~, is fine)."""
    if not isinstance(value, str) or not value:
        return "is empty", f"give the {what}"
    if _unprintable(value):
        return "contains a newline or control character", f"give the {what} on one line, in printable characters"
    return None


def version(value: object) -> Problem:
    if not isinstance(value, str) or not value:
        return "is missing", "give a release tag such as v1.4.2, or a local binary"
    if not _VERSION.fullmatch(value):
        return f"{value!r} is not a version", "use a release tag vX.Y.Z, or a dev version such as v1.4.2-3-gabc1234"
    if _SHORT_TAG.fullmatch(value):
        return f"{value!r} is a malformed release tag", "release tags have exactly three numbers: vX.Y.Z"
    return None


def url(value: object) -> Problem:
    """The release archive's base URL: https only (the digests are fetched from it on the operator's side, and
    the nodes download over it), with no credentials in it (a URL is shown in logs, state and process lists)."""
    example = "e.g. https://releases.example.net/llmgw"
    if not isinstance(value, str) or not value:
        return "is missing", f"give the release archive's base URL, {example}"
    if _CONTROL.search(value) or " " in value:
        return "contains spaces or control characters", f"give a plain https URL, {example}"
    parts = urlsplit(value)
    if parts.scheme == "http":
        return (f"{value!r} is plain http: anyone on the path could serve another checksums.txt or binary",
                f"serve the releases over https (agent.releaseCa for a private CA), {example}")
    if parts.scheme != "https" or not parts.hostname:
        return f"{value!r} is not an https URL", f"give the release archive's base URL, {example}"
    if "@" in parts.netloc:
        # Never echo it: the part before the @ is a credential.
        return ("has credentials in it (user:password@): they would be shown in logs, state and the nodes' "
                "process lists", "remove them: serve the releases to the machines that need them without a login "
                "in the URL (or use agent.fetch: operator)")
    if parts.query or parts.fragment:
        return f"{value!r} has a query or fragment", "give the base URL only; <tag>/<file> is appended to it"
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        return f"{value!r} has a port that is not a number from 0 to 65535", f"fix the port, {example}"
    return None


def ssh_wait(value: object) -> Problem:
    if not _number(value):
        return f"{value!r} is not a number of seconds", "give the SSH wait in seconds, e.g. 120"
    if value < 0 or value > MAX_SSH_WAIT:
        return f"{value!r} is out of range", f"give 0 to {int(MAX_SSH_WAIT)} seconds"
    return None


def ssh_user(value: object) -> Problem:
    if not isinstance(value, str) or not _SSH_USER.fullmatch(value):
        return f"{value!r} is not a user name", "give the login user on the node, e.g. deploy or root"
    return None


def _host_key_words(value: object) -> tuple[str, str] | None:
    """(type, base64 blob) of an SSH public key line 'TYPE BASE64 [COMMENT]' as in a host's .pub file, or None.

    cryptography's OpenSSH public-key loader checks that the blob is whole: the
    type it names is the line's, and it holds that type's fields (an ed25519 key
    of 32 bytes; an ECDSA point on the curve its type names), which catches a
    truncated or mispasted key. (Imported here: previews without a pin need not
    load cryptography.)
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    if not isinstance(value, str):
        return None
    words = value.split()
    if len(words) < 2 or words[0] not in HOST_KEY_TYPES:
        return None
    try:
        load_ssh_public_key(f"{words[0]} {words[1]}".encode())
    except (ValueError, UnsupportedAlgorithm):
        return None
    return words[0], words[1]


_FINGERPRINT = re.compile(r"\A(SHA256:[A-Za-z0-9+/]{43}=?|(MD5:)?[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){15})\Z")
"""A host key's fingerprint as `ssh-keygen -l` and ssh print it: SHA256:<base64>, or MD5 in hex pairs."""


def host_key(value: object) -> Problem:
    # Whitespace (a .pub file's tab or newline) only separates words, which are normalised; anything else is refused.
    if isinstance(value, str) and _unprintable(" ".join(value.split())):
        return ("contains a control character",
                "paste the node's host key as its .pub file has it: 'ssh-ed25519 AAAAC3...'")
    if isinstance(value, str) and _FINGERPRINT.fullmatch(value.strip()):
        return ("is a fingerprint of a host key, not the key: a fingerprint cannot be checked against what the node "
                "presents",
                "give the public key line instead, 'ssh-ed25519 AAAAC3...': the node's "
                "/etc/ssh/ssh_host_ed25519_key.pub, or `ssh-keyscan -t ed25519 ADDRESS` without its first word, "
                "after checking that `ssh-keygen -lf` of it prints this fingerprint")
    if _host_key_words(value) is None:
        return ("is not an SSH public key",
                "paste the node's /etc/ssh/ssh_host_ed25519_key.pub (a trailing comment is dropped), "
                "or a known_hosts line without the host: 'ssh-ed25519 AAAAC3...'")
    return None


def normalise_host_key(value: str) -> str:
    """A valid host-key pin as 'TYPE BASE64': a .pub file's trailing comment and extra spaces dropped.

    The one normalisation of a pinned key, used by the stack config and by the
    providers' Connection spec, so both compare the same text.
    """
    words = _host_key_words(value)
    if words is None:
        raise ValueError("not an SSH public key")  # callers validate with host_key() first
    return " ".join(words)


def did_you_mean(key: str, valid: Iterable[str]) -> str:
    """The fix for an unknown setting: the nearest valid key, or the list of them."""
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    return f"did you mean {close[0]}?" if close else f"use one of {', '.join(valid)}"


def split_hop(value: str) -> tuple[str, str, int]:
    """'user@host[:port]' (a jump host as `ssh -J` takes it) -> (user, host, port); validate with ``hop`` first."""
    user, _, rest = value.partition("@")
    host, _, port_text = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    return user, host, int(port_text) if port_text else 22


def hop(value: object) -> Problem:
    """A jump host as `ssh -J` takes it: user@host or user@host:port."""
    fix = "write a jump host as user@host or user@host:port, e.g. deploy@bastion.example.net"
    if not isinstance(value, str) or "@" not in value:
        return f"{value!r} is not user@host[:port]", fix
    rest = value.partition("@")[2]
    if rest.count(":") == 1 and not _PORT.fullmatch(rest.rpartition(":")[2]):  # int() takes " 22\n", "2_2", "٢٢"
        return f"{value!r} has a port that is not a number", fix
    user, host, port_number = split_hop(value)
    for bad in (ssh_user(user), address(host), port(port_number)):
        if bad:
            return f"{value!r}: {bad[0]}", fix
    return None


def boolean(value: object) -> Problem:
    if not isinstance(value, bool):
        return f"{value!r} is not true or false", "write true or false, without quotes"
    return None


def _matching(pattern: re.Pattern[str], what: str, fix: str) -> Callable[[object], Problem]:
    """A validator of strings that ``pattern`` matches: otherwise '<value> is not <what>', and ``fix``."""

    def check(value: object) -> Problem:
        if isinstance(value, str) and pattern.fullmatch(value):
            return None
        return f"{value!r} is not {what}", fix

    return check


interface = _matching(_IFNAME, "a network interface name",
                      "give an interface name such as eth0 or bond0: up to 15 letters, digits, '_', '.', ':' or '-', "
                      "not starting with '-' or '.'")
hca = _matching(_HCA, "an HCA name",
                "give InfiniBand HCA names as listed in /sys/class/infiniband, e.g. mlx5_0: letters, digits, '_', '.' "
                "or '-', not starting with '-' or '.'")
fabric_name = _matching(_LABEL, "a fabric name", "name the fabric with lowercase letters, digits and '-', e.g. ib-east")
key_origin = _matching(re.compile(r"\A(node|operator)\Z"), "node or operator",
                       "write node (the node makes its key pair and it never leaves it; the default) "
                       "or operator (the key is made on the machine running Pulumi and kept in state, encrypted)")


def positive_int(value: object) -> Problem:
    if not _number(value) or value != int(value) or value < 1:
        return f"{value!r} is not a whole number above 0", "give how many agents may restart at once, e.g. 2"
    return None


def hours(value: object, upper: float = 24 * 3650) -> Problem:
    if not _number(value) or not 0 < value <= upper:
        return f"{value!r} is not a number of hours above 0 and at most {upper:g}", "give a duration in hours, e.g. 8760 for a year"
    return None
