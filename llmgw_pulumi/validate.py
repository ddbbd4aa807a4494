"""Validation of single values, shared by the stack-config reader and providers' check().

Each validator returns ``None`` when the value is acceptable, or a
``(problem, fix)`` pair that names what is wrong and what to write instead.
They never echo secret values, and they never touch the network or the disk.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

Problem = tuple[str, str] | None

# RFC 1123 label: what a hostname component, a systemd-friendly id and a
# certificate CN can all safely be.
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
RELEASE_TAG = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,127}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_HCA = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SSH_PUBLIC_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,3}$")

MAX_SSH_WAIT = 3600.0


def node_id(value: object) -> Problem:
    if not isinstance(value, str) or not value:
        return "is missing", "give every node an id, e.g. id: gpu-node-01"
    if not _LABEL.match(value):
        return (
            f"{value!r} is not a valid DNS label",
            "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )
    return None


def address(value: object) -> Problem:
    """An IP address or DNS name that SSH (or the agent) can connect to."""
    if not isinstance(value, str) or not value:
        return "is missing", "give the node's IP address or DNS name"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if _HOSTNAME.match(value) and not re.fullmatch(r"[0-9.]+", value):
        return None
    return f"{value!r} is not an IP address or a DNS name", "write e.g. 10.0.0.12 or gpu01.example.net"


def port(value: object) -> Problem:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or not 1 <= value <= 65535:
        return f"{value!r} is not a TCP port", "use a whole number from 1 to 65535"
    return None


def server(value: object) -> Problem:
    """A control-plane address: host:port, [v6]:port."""
    if not isinstance(value, str) or not value.strip():
        return "is empty", "write each control plane as host:port, e.g. cp1.example.net:7443"
    if _CONTROL.search(value) or " " in value or '"' in value or "'" in value:
        return f"{value!r} contains spaces, quotes or control characters", "write it as host:port"
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return f"{value!r} is not [ipv6]:port", "write an IPv6 server as [addr]:port"
        portpart = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address", "write an IPv6 server as [addr]:port"
    else:
        host, sep, portpart = value.rpartition(":")
        if not sep or not host:
            return f"{value!r} has no port", f"add the control plane's port, e.g. {value}:7443"
        bad = address(host)
        if bad:
            return f"{value!r}: host {bad[0]}", "write it as host:port"
    if not portpart.isdigit() or not 1 <= int(portpart) <= 65535:
        return f"{value!r} has no valid port", "the port must be a number from 1 to 65535"
    return None


def abs_path(value: object, what: str = "path") -> Problem:
    if not isinstance(value, str) or not value:
        return "is empty", f"give the absolute {what}"
    if _CONTROL.search(value):
        return "contains a newline or control character", f"give the {what} on one line"
    if not value.startswith("/"):
        return f"{value!r} is relative", f"give the absolute {what} on the node, e.g. /opt/llama/bin/llama-server"
    if "/../" in value + "/" or value.endswith("/.."):
        return f"{value!r} contains '..'", f"give the {what} without '..'"
    return None


def version(value: object) -> Problem:
    if not isinstance(value, str) or not value:
        return "is missing", "give a release tag such as v1.4.2, or a local binary"
    if not _VERSION.match(value):
        return f"{value!r} is not a version", "use a release tag vX.Y.Z, or a dev version such as v1.4.2-3-gabc1234"
    if value[0] == "v" and re.match(r"^v[0-9]", value) and not RELEASE_TAG.match(value) and re.match(r"^v[0-9]+(\.[0-9]+){0,2}$", value):
        return f"{value!r} is a malformed release tag", "release tags have exactly three numbers: vX.Y.Z"
    return None


def url(value: object) -> Problem:
    if not isinstance(value, str) or not value:
        return "is missing", "give the release archive's base URL, e.g. https://releases.example.net/llmgw"
    if _CONTROL.search(value) or " " in value:
        return "contains spaces or control characters", "give a plain http(s) URL"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{value!r} is not an http(s) URL", "give the release archive's base URL, e.g. https://releases.example.net/llmgw"
    if parts.query or parts.fragment:
        return f"{value!r} has a query or fragment", "give the base URL only; <tag>/<file> is appended to it"
    return None


def ssh_wait(value: object) -> Problem:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number of seconds", "give the SSH wait in seconds, e.g. 120"
    if value < 0 or value > MAX_SSH_WAIT:
        return f"{value!r} is out of range", f"give 0 to {int(MAX_SSH_WAIT)} seconds"
    return None


def ssh_user(value: object) -> Problem:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", value):
        return f"{value!r} is not a user name", "give the login user on the node, e.g. deploy or root"
    return None


def host_key(value: object) -> Problem:
    if not isinstance(value, str) or not _SSH_PUBLIC_KEY.match(value.strip()):
        return "is not an SSH public key", "write it as in known_hosts, without the host: e.g. 'ssh-ed25519 AAAAC3...'"
    return None


def interface(value: object) -> Problem:
    if not isinstance(value, str) or not _IFNAME.match(value):
        return f"{value!r} is not a network interface name", "give an interface name such as eth0 or bond0"
    return None


def hca(value: object) -> Problem:
    if not isinstance(value, str) or not _HCA.match(value):
        return f"{value!r} is not an HCA name", "give InfiniBand HCA names as listed in /sys/class/infiniband, e.g. mlx5_0"
    return None


def fabric_name(value: object) -> Problem:
    if not isinstance(value, str) or not _LABEL.match(value):
        return f"{value!r} is not a fabric name", "name the fabric with lowercase letters, digits and '-', e.g. ib-east"
    return None


def hours(value: object, upper: float = 24 * 3650) -> Problem:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= upper:
        return f"{value!r} is not a number of hours above 0 and at most {upper:g}", "give a duration in hours, e.g. 8760 for a year"
    return None
