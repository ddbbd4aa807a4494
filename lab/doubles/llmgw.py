"""A test double of the `llmgw` binary (the real one is not public).

What it does, as the onboarding contract (SPEC.md) needs it:
- `llmgw --version` prints `llmgw version <VERSION>`; `build_llmgw()` bakes the
  version in, so two versions are two different files with different checksums.
- `llmgw agent --config FILE` reads agent.yaml, checks it (an unknown key, a
  malformed value or an unreadable TLS file exits 2 at once, so systemd marks
  the unit failed), then keeps one mutual-TLS stream to the first control plane
  that accepts it: `HELLO <node id>`, then `PING`/`PONG` every 2 s. A refused or
  failed server makes it try the next; when all failed it sleeps 1 s and starts
  again from the first. Every step is one line on stderr. SIGTERM exits 0.
- `llmgw ctl cert init-ca --dir PKI` and
  `llmgw ctl cert issue-client NODE --dir PKI --out DIR` (writes `DIR/NODE.pem`
  and `DIR/NODE-key.pem`) run lab/pki.py, which the built file carries inside.
- `llmgw ctl nodes --server HOST:PORT --ca CA --cert CERT --key KEY` asks that
  control plane (mutual TLS, with a client certificate of the cluster CA) which
  nodes it has, and prints them as a table: a header line, then one line per
  node whose stream the control plane accepted and holds open now, its node id
  first. It exits 1, saying why on stderr, when it cannot ask.

What it does not do: run, install or adopt engines; discover GPUs, fabrics or
the management address (those keys of agent.yaml are accepted and ignored);
any other `ctl` command; revocation. The stream protocol is this lab's own
line protocol, not the real one.

On a node it runs on Debian 12's python3 with python3-yaml only: the agent
path imports nothing but the standard library and PyYAML. `ctl cert` needs
`cryptography` and runs only on the operator's machine.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import ssl
import sys
import time
import types
from pathlib import Path

VERSION = "v0.0.0-dev"

# The source of lab/pki.py, baked in by build_llmgw(); None when run from the repository.
PKI_SOURCE = None

PING_INTERVAL = 2.0
RETRY_PAUSE = 1.0
TIMEOUT = 5.0  # to connect, for the TLS handshake, for each reply

CONFIG_KEYS = frozenset(
    {"server", "servers", "tls", "node_id", "mgmt_addr", "mgmt_interface", "fabrics", "discovery", "engines"}
)
TLS_KEYS = ("ca", "cert", "key")


def build_llmgw(version: str, python: str = "/usr/bin/python3") -> bytes:
    """The bytes of an `llmgw` executable reporting `version`, run by `python`."""
    if not version or any(c.isspace() for c in version):
        raise ValueError(f"a version is one non-empty word, not {version!r}")
    source = Path(__file__).read_text()
    pki_source = (Path(__file__).parent.parent / "pki.py").read_text()
    source = _replace_line(source, "VERSION", repr(version))
    source = _replace_line(source, "PKI_SOURCE", repr(pki_source))
    return f"#!{python}\n{source}".encode()


def _replace_line(source: str, name: str, value: str) -> str:
    new, n = re.subn(rf"^{name} = .*$", lambda _: f"{name} = {value}", source, count=1, flags=re.M)
    if n != 1:
        raise RuntimeError(f"no '{name} = ...' line to replace in {__file__}")
    return new


class ConfigError(Exception):
    """agent.yaml is unusable; the agent exits 2."""


class Terminated(Exception):
    """SIGTERM or SIGINT arrived."""


def log(message: str) -> None:
    print(f"llmgw: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- agent


class AgentConfig:
    def __init__(self, servers: list[tuple[str, int]], node_id: str, ssl_context: ssl.SSLContext,
                 engines: list[str] | None = None):
        self.servers = servers
        self.node_id = node_id
        self.ssl_context = ssl_context
        self.engines = engines or []


def load_config(path: str) -> AgentConfig:
    import yaml  # python3-yaml on the node

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(CONFIG_KEYS))}")

    if ("server" in data) == ("servers" in data):
        raise ConfigError(f"{path}: give exactly one of 'server' and 'servers'")
    if "server" in data:
        addresses = [data["server"]]
    else:
        addresses = data["servers"]
        if not isinstance(addresses, list) or not addresses:
            raise ConfigError(f"{path}: 'servers' must be a non-empty list of \"host:port\"")
    servers = [parse_address(path, a) for a in addresses]

    node_id = data.get("node_id")
    if node_id is None:
        node_id = socket.gethostname()
    elif not isinstance(node_id, str) or not node_id:
        raise ConfigError(f"{path}: 'node_id' must be a non-empty string")

    tls = data.get("tls")
    if not isinstance(tls, dict):
        raise ConfigError(f"{path}: 'tls' must be a mapping with {', '.join(TLS_KEYS)}")
    extra = sorted(str(k) for k in tls if k not in TLS_KEYS)
    missing = [k for k in TLS_KEYS if not isinstance(tls.get(k), str)]
    if extra or missing:
        raise ConfigError(f"{path}: 'tls' needs exactly {', '.join(TLS_KEYS)} (paths); "
                          f"missing: {', '.join(missing) or '-'}; unknown: {', '.join(extra) or '-'}")
    for k in TLS_KEYS:
        if not Path(tls[k]).is_file():
            raise ConfigError(f"{path}: tls.{k}: no such file {tls[k]}")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls["ca"])
        ctx.load_cert_chain(tls["cert"], tls["key"])
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{path}: cannot load tls files ({tls['ca']}, {tls['cert']}, {tls['key']}): {exc}") from exc
    engines = data.get("engines") or {}
    paths = [p for conf in engines.values() if isinstance(conf, dict) for p in conf.values() if isinstance(p, str)]
    return AgentConfig(servers, node_id, ctx, paths)


def parse_address(path: str, address: object) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port)."""
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if host and port.isdigit() and 0 < int(port) < 65536:
            return host, int(port)
    raise ConfigError(f"{path}: not a \"host:port\" address: {address!r}")


def launch_engines(paths: list[str]) -> None:
    """Start each configured engine as `<path> serve` in its own session, as the real agent starts
    engines: they live in the agent's unit (cgroup) but outlive the agent, which KillMode=process keeps."""
    import subprocess

    for path in paths:
        try:
            proc = subprocess.Popen([path, "serve"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            log(f"launched engine {path} (pid {proc.pid})")
        except OSError as exc:
            log(f"cannot launch engine {path}: {exc}")


def run_agent(config: AgentConfig) -> None:
    """Keep a stream to the first control plane that accepts us, forever."""
    names = ", ".join(fmt(s) for s in config.servers)
    log(f"agent {VERSION} starting as {config.node_id}; control planes: {names}")
    launch_engines(config.engines)
    while True:
        for server in config.servers:
            session(config, server)
        log(f"no control plane accepted {config.node_id}; retrying in {RETRY_PAUSE:g}s")
        time.sleep(RETRY_PAUSE)


def session(config: AgentConfig, server: tuple[str, int]) -> None:
    """One stream to one control plane, until it refuses, fails or closes."""
    addr = fmt(server)
    log(f"connecting to {addr}")
    try:
        raw = socket.create_connection(server, timeout=TIMEOUT)
    except OSError as exc:
        log(f"cannot connect to {addr}: {exc}")
        return
    try:
        with config.ssl_context.wrap_socket(raw, server_hostname=server[0]) as conn, conn.makefile("rb") as reader:
            conn.sendall(f"HELLO {config.node_id}\n".encode())
            reply = reader.readline(256).decode(errors="replace").strip()
            if reply != "OK":
                reason = reply.removeprefix("REFUSED ") if reply.startswith("REFUSED ") else f"answered {reply!r}"
                log(f"refused by {addr}: {reason}")
                return
            log(f"connected to {addr} as {config.node_id}")
            while True:
                time.sleep(PING_INTERVAL)
                conn.sendall(b"PING\n")
                reply = reader.readline(256).decode(errors="replace").strip()
                if reply != "PONG":
                    log(f"lost {addr}: " + (f"answered {reply!r} to PING" if reply else "connection closed"))
                    return
    except ssl.SSLCertVerificationError as exc:
        log(f"cannot trust {addr}: certificate verify failed: {exc.verify_message}")
    except (OSError, ssl.SSLError) as exc:
        log(f"stream to {addr} failed: {exc}")
    finally:
        raw.close()


def fmt(server: tuple[str, int]) -> str:
    host, port = server
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _terminate(signum: int, _frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


# ---------------------------------------------------------------------------- ctl


def pki() -> types.ModuleType:
    """lab/pki.py: the copy baked into this file, or the repository's."""
    if PKI_SOURCE is None:
        from lab import pki as module

        return module
    module = types.ModuleType("llmgw_pki")
    sys.modules[module.__name__] = module
    exec(compile(PKI_SOURCE, "lab/pki.py", "exec"), module.__dict__)
    return module


def ctl_nodes(args: argparse.Namespace) -> int:
    """`ctl nodes`: the control plane's nodes, as a table whose first column is the node id."""
    try:
        host, port = parse_address("--server", args.server)
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=args.ca)
        ctx.load_cert_chain(args.cert, args.key)
        with socket.create_connection((host, port), timeout=TIMEOUT) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as conn, conn.makefile("rb") as reader:
            conn.sendall(b"NODES\n")
            nodes = []
            while (line := reader.readline(256).decode(errors="replace").rstrip("\n")) != "END":
                if not line.startswith("NODE "):
                    log(f"{args.server} answered {line!r} to NODES" if line else f"{args.server} closed the listing")
                    return 1
                nodes.append(line[5:])
    except ConfigError as exc:
        log(str(exc))
        return 2
    except ssl.SSLCertVerificationError as exc:
        log(f"cannot trust {args.server}: certificate verify failed: {exc.verify_message}")
        return 1
    except (OSError, ssl.SSLError) as exc:
        log(f"cannot ask {args.server}: {exc}")
        return 1
    print(f"{'NODE':<24} STREAM")
    for node in nodes:
        print(f"{node:<24} connected")
    return 0


def ctl(args: argparse.Namespace) -> int:
    if args.ctl_command == "nodes":
        return ctl_nodes(args)
    try:
        if args.cert_command == "init-ca":
            pki().init_ca(Path(args.dir))
            print(f"created an authority in {args.dir}")
        else:
            cert, key = pki().issue_client_cert(Path(args.dir), Path(args.out), args.node)
            print(f"issued {cert} and {key} for {args.node}")
    except ImportError as exc:
        log(f"ctl cert needs the python package 'cryptography' ({exc})")
        return 1
    except (OSError, ValueError) as exc:
        log(str(exc))
        return 1
    return 0


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw test double")
    parser.add_argument("--version", action="store_true", help="print the version")
    commands = parser.add_subparsers(dest="command")
    agent = commands.add_parser("agent", help="run the node agent")
    agent.add_argument("--config", required=True)
    ctl_commands = commands.add_parser("ctl").add_subparsers(dest="ctl_command", required=True)
    cert = ctl_commands.add_parser("cert")
    nodes = ctl_commands.add_parser("nodes", help="list the nodes the control plane has")
    for flag in ("--server", "--ca", "--cert", "--key"):
        nodes.add_argument(flag, required=True)
    cert_commands = cert.add_subparsers(dest="cert_command", required=True)
    cert_commands.add_parser("init-ca").add_argument("--dir", required=True)
    issue = cert_commands.add_parser("issue-client")
    issue.add_argument("node")
    issue.add_argument("--dir", required=True)
    issue.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    if args.version:
        print(f"llmgw version {VERSION}")
        return 0
    if args.command == "ctl":
        return ctl(args)
    if args.command != "agent":
        parser.print_usage(sys.stderr)
        return 2

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log(f"configuration error: {exc}")
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    try:
        run_agent(config)
    except Terminated as exc:
        log(f"received {exc}; exiting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
