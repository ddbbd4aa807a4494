"""The lab's test doubles, tested for real: TLS handshakes and HTTP on 127.0.0.1 only.

The llmgw double runs as a built executable in a subprocess, with a stand-in
`cryptography` package that fails to import, as on a node where only
python3-minimal and python3-yaml exist.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab import pki
from lab.control_plane import ControlPlane, Event
from lab.doubles.llmgw import build_llmgw
from lab.release_server import publish_release, release_name

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
WAIT = 15.0  # generous: the agent retries every second


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path / "pki")
    return tmp_path / "pki"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Subprocesses a test starts; each is terminated and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def control_planes() -> Iterator[list[ControlPlane]]:
    started: list[ControlPlane] = []
    yield started
    for cp in started:
        cp.stop()


@pytest.fixture
def llmgw(tmp_path: Path) -> Path:
    return write_llmgw(tmp_path / "bin", "v1.2.3")


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import cryptography` fails, as on a node."""
    poison = tmp_path / "no-cryptography" / "cryptography"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('cryptography is not installed on a node')\n")
    return {**os.environ, "PYTHONPATH": str(poison.parent)}


def write_llmgw(directory: Path, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llmgw"
    path.write_bytes(build_llmgw(version, python=sys.executable))
    path.chmod(0o755)
    return path


def start_control_plane(control_planes: list[ControlPlane], pki_dir: Path, standby: bool = False) -> ControlPlane:
    cp = ControlPlane(pki_dir, LOOPBACK, standby=standby)
    control_planes.append(cp)
    return cp.start()


def agent_config(
    tmp_path: Path, pki_dir: Path, cert_cn: str, servers: list[str], node_id: str | None = None, **extra: object
) -> Path:
    """An agent.yaml as the SPEC shapes it, with a fresh identity whose CN is `cert_cn`."""
    identity = tmp_path / f"identity-{cert_cn}"
    cert, key = pki.issue_client_cert(pki_dir, identity, cert_cn)
    config: dict[str, object] = {"server": servers[0]} if len(servers) == 1 else {"servers": servers}
    config["tls"] = {"ca": str(pki_dir / pki.CA_CERT), "cert": str(cert), "key": str(key)}
    if node_id is not None:
        config["node_id"] = node_id
    config.update(extra)
    path = tmp_path / f"agent-{cert_cn}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_agent(
    processes: list[subprocess.Popen[bytes]], llmgw: Path, config: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Path]:
    log = config.with_suffix(".log")
    with log.open("wb") as stderr:
        proc = subprocess.Popen([str(llmgw), "agent", "--config", str(config)], stderr=stderr, env=env)
    processes.append(proc)
    return proc, log


def logged(log: Path, text: str, timeout: float = 5.0) -> bool:
    """Whether `text` appears in the agent's log within `timeout` (it logs after it acts)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def refusals(cp: ControlPlane, outcome: str) -> list[Event]:
    return [e for e in cp.events if e.outcome == outcome]


# ---------------------------------------------------------------------------- lab.pki


def test_init_ca_writes_the_root_and_its_key_with_their_modes(tmp_path: Path) -> None:
    pki.init_ca(tmp_path / "pki")

    assert stat.S_IMODE((tmp_path / "pki" / "ca.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "pki" / "ca-key.pem").stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((tmp_path / "pki" / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    with pytest.raises(FileExistsError):
        pki.init_ca(tmp_path / "pki")


def test_issuing_without_an_authority_names_the_missing_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"no authority in {tmp_path}"):
        pki.issue_client_cert(tmp_path, tmp_path / "out", "node1")


def test_server_cert_carries_its_sans_and_chains_to_the_root(pki_dir: Path, tmp_path: Path) -> None:
    cert_path, key_path = pki.issue_server_cert(pki_dir, tmp_path / "srv", "releases", [LOOPBACK], ["releases.lab.test"])

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((pki_dir / "ca.pem").read_bytes()))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [LOOPBACK]
    assert sans.get_values_for_type(x509.DNSName) == ["releases.lab.test"]
    assert ExtendedKeyUsageOID.SERVER_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


# ---------------------------------------------------------------------------- the llmgw double: agent


def test_agent_connects_under_its_node_id(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    _, log = start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, "node1", [cp.address], "node1"), node_env)

    assert cp.wait_for({"node1"}, WAIT), log.read_text()
    assert cp.connected() == {"node1"}
    assert [(e.node_id, e.cn) for e in refusals(cp, "accepted")] == [("node1", "node1")]
    assert logged(log, f"connected to {cp.address} as node1"), log.read_text()


def test_agent_without_node_id_uses_the_hostname(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    hostname = socket.gethostname()
    cp = start_control_plane(control_planes, pki_dir)
    start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, hostname, [cp.address]), node_env)

    assert cp.wait_for({hostname}, WAIT)


def test_a_node_id_other_than_the_certificates_cn_is_refused(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    _, log = start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, "node-a", [cp.address], "node-b"), node_env)

    # Two refusals: the agent was refused, retried, and was refused again.
    assert cp.wait_for_event(lambda e: len(refusals(cp, "refused cn-mismatch")) >= 2, WAIT)
    assert {(e.node_id, e.cn) for e in refusals(cp, "refused cn-mismatch")} == {("node-b", "node-a")}
    assert cp.connected() == set()
    assert refusals(cp, "accepted") == []
    assert logged(log, f"refused by {cp.address}: cn-mismatch"), log.read_text()


def test_many_agents_at_once_and_stop_ends_every_stream(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    nodes = {f"node{i}" for i in range(8)}
    cp = start_control_plane(control_planes, pki_dir)
    for node in sorted(nodes):
        start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, node, [cp.address], node), node_env)

    assert cp.wait_for(nodes, WAIT), cp.events
    assert cp.connected() == nodes

    cp.stop()

    assert cp.connected() == set()
    assert {e.node_id for e in cp.events if e.outcome == "closed"} == nodes


def test_agent_passes_a_standby_and_stays_with_the_primary(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    standby = start_control_plane(control_planes, pki_dir, standby=True)
    primary = start_control_plane(control_planes, pki_dir)
    config = agent_config(tmp_path, pki_dir, "node1", [standby.address, primary.address], "node1")
    start_agent(processes, llmgw, config, node_env)

    assert primary.wait_for({"node1"}, WAIT)
    assert [e.node_id for e in refusals(standby, "refused standby")] == ["node1"]
    assert standby.connected() == set()
    time.sleep(2.5)  # at least one PING/PONG later, still with the primary
    assert primary.connected() == {"node1"}
    assert len(refusals(primary, "accepted")) == 1

    # The primary goes away and the standby takes over: the agent follows.
    primary.stop()
    standby.standby = False
    assert standby.wait_for({"node1"}, WAIT)


def test_agent_does_not_trust_a_control_plane_outside_the_cluster_ca(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    pki.init_ca(tmp_path / "other-pki", cn="another CA")
    impostor = start_control_plane(control_planes, tmp_path / "other-pki")
    real = start_control_plane(control_planes, pki_dir)
    config = agent_config(tmp_path, pki_dir, "node1", [impostor.address, real.address], "node1")
    _, log = start_agent(processes, llmgw, config, node_env)

    assert real.wait_for({"node1"}, WAIT)
    assert impostor.events and all(e.outcome.startswith("tls-failed") for e in impostor.events)
    assert logged(log, f"cannot trust {impostor.address}: certificate verify failed"), log.read_text()


def ctl_nodes(llmgw: Path, cp: ControlPlane, identity: tuple[Path, Path], ca: Path) -> subprocess.CompletedProcess[str]:
    """`llmgw ctl nodes` against ``cp``, with the operator's client identity (certificate, key)."""
    return subprocess.run([str(llmgw), "ctl", "nodes", "--server", cp.address, "--ca", str(ca),
                           "--cert", str(identity[0]), "--key", str(identity[1])],
                          capture_output=True, text=True, timeout=30, check=False)


def test_ctl_nodes_lists_the_nodes_whose_streams_the_control_plane_accepted_and_holds(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    operator = pki.issue_client_cert(pki_dir, tmp_path / "operator", "operator")
    ca = pki_dir / pki.CA_CERT
    before = ctl_nodes(llmgw, cp, operator, ca)
    assert before.returncode == 0, before.stderr
    assert [line.split()[0] for line in before.stdout.splitlines()] == ["NODE"]  # the header, no node yet

    good, _ = start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, "node1", [cp.address], "node1"), node_env)
    start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, "node-a", [cp.address], "node-b"), node_env)
    pki.init_ca(tmp_path / "other-pki", cn="another CA")
    foreign = agent_config(tmp_path, tmp_path / "other-pki", "node3", [cp.address], "node3")
    start_agent(processes, llmgw, foreign, node_env)
    assert cp.wait_for({"node1"}, WAIT)
    assert cp.wait_for_event(lambda e: e.outcome == "refused cn-mismatch", WAIT)

    listing = ctl_nodes(llmgw, cp, operator, ca)
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()[1:]] == ["node1"]  # not node-b, nor node3
    assert [e.cn for e in cp.events if e.outcome.startswith("listed")] == ["operator", "operator"]

    good.terminate()  # its stream ends: the control plane does not list it any more
    good.wait(timeout=10)
    assert cp.wait_for_event(lambda e: e.outcome == "closed" and e.node_id == "node1", WAIT)
    after = ctl_nodes(llmgw, cp, operator, ca)
    assert after.returncode == 0 and after.stdout.splitlines()[1:] == [], after


def test_ctl_nodes_needs_a_certificate_of_the_cluster_ca(
    tmp_path: Path, pki_dir: Path, llmgw: Path, control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    pki.init_ca(tmp_path / "other-pki", cn="another CA")
    stranger = pki.issue_client_cert(tmp_path / "other-pki", tmp_path / "stranger", "operator")

    refused = ctl_nodes(llmgw, cp, stranger, pki_dir / pki.CA_CERT)

    assert refused.returncode == 1 and refused.stdout == "", refused
    assert f"cannot ask {cp.address}: " in refused.stderr, refused.stderr  # an alert, or the connection closed
    assert cp.wait_for_event(lambda e: e.outcome.startswith("tls-failed"), WAIT)
    assert not [e for e in cp.events if e.outcome.startswith("listed")]


def test_sigterm_stops_the_agent_cleanly_and_ends_its_stream(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    proc, log = start_agent(processes, llmgw, agent_config(tmp_path, pki_dir, "node1", [cp.address], "node1"), node_env)
    assert cp.wait_for({"node1"}, WAIT)

    proc.terminate()

    assert proc.wait(timeout=5) == 0
    assert cp.wait_for_event(lambda e: e.outcome == "closed" and e.node_id == "node1", 5)
    assert cp.connected() == set()
    assert "received SIGTERM; exiting" in log.read_text()  # written before it exited


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": 8}, "unknown key(s) gpus"),
        ({"tls": {"ca": "/nonexistent/ca.pem", "cert": "/nonexistent/a.pem", "key": "/nonexistent/k.pem"}},
         "tls.ca: no such file /nonexistent/ca.pem"),
        ({"servers": ["127.0.0.1:7443"]}, "exactly one of 'server' and 'servers'"),
        ({"server": "127.0.0.1"}, "not a \"host:port\" address: '127.0.0.1'"),
    ],
    ids=["unknown-key", "missing-tls-files", "server-and-servers", "no-port"],
)
def test_a_configuration_error_exits_2_at_once(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str], change: dict[str, object], message: str
) -> None:
    config = agent_config(tmp_path, pki_dir, "node1", ["127.0.0.1:7443"], "node1")
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), **change}))

    result = subprocess.run([str(llmgw), "agent", "--config", str(config)], capture_output=True, env=node_env,
                            timeout=10)

    assert result.returncode == 2
    assert message in result.stderr.decode()


def test_agent_accepts_every_key_the_spec_writes(
    tmp_path: Path, pki_dir: Path, llmgw: Path, node_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]], control_planes: list[ControlPlane],
) -> None:
    cp = start_control_plane(control_planes, pki_dir)
    config = agent_config(
        tmp_path, pki_dir, "node1", [cp.address], "node1",
        mgmt_addr="10.250.0.11", mgmt_interface="eth0",
        fabrics=[{"name": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]}],
        discovery={"nvidia_smi": "/opt/nvidia/bin/nvidia-smi", "ib_root": "/tmp/ib"},
        engines={"llamacpp": {"bin": "/opt/llama/llama-server"}, "vllm": {"bin": "/opt/vllm/bin/vllm"},
                 "sglang": {"python": "/opt/sglang/bin/python"}},
    )
    start_agent(processes, llmgw, config, node_env)

    assert cp.wait_for({"node1"}, WAIT)


# ---------------------------------------------------------------------------- the llmgw double: build, version, ctl


@pytest.mark.parametrize("version", ["v1.2.3", "v1.2.3-4-gabcdef"])
def test_version_is_the_last_word_of_llmgw_version(tmp_path: Path, node_env: dict[str, str], version: str) -> None:
    llmgw = write_llmgw(tmp_path, version)

    out = subprocess.run([str(llmgw), "--version"], capture_output=True, env=node_env, timeout=10, check=True)

    assert out.stdout.decode().split()[-1] == version


def test_builds_of_different_versions_differ() -> None:
    a, b = build_llmgw("v1.2.3"), build_llmgw("v1.2.4")

    assert a.startswith(b"#!/usr/bin/python3\n")
    assert hashlib.sha256(a).digest() != hashlib.sha256(b).digest()
    with pytest.raises(ValueError):
        build_llmgw("v1 2")


def test_ctl_cert_issues_an_identity_whose_cn_is_the_node_id(tmp_path: Path, llmgw: Path) -> None:
    pki_dir, out = tmp_path / "pki", tmp_path / "out"
    subprocess.run([str(llmgw), "ctl", "cert", "init-ca", "--dir", str(pki_dir)], check=True, timeout=30)

    subprocess.run([str(llmgw), "ctl", "cert", "issue-client", "node7", "--dir", str(pki_dir), "--out", str(out)],
                   check=True, timeout=30)

    cert = x509.load_pem_x509_certificate((out / "node7.pem").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node7"
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((pki_dir / "ca.pem").read_bytes()))
    assert stat.S_IMODE((out / "node7-key.pem").stat().st_mode) == 0o600


def test_ctl_cert_without_an_authority_fails_and_says_so(tmp_path: Path, llmgw: Path) -> None:
    result = subprocess.run(
        [str(llmgw), "ctl", "cert", "issue-client", "node7", "--dir", str(tmp_path / "pki"), "--out", str(tmp_path)],
        capture_output=True, timeout=30,
    )

    assert result.returncode != 0
    assert f"no authority in {tmp_path / 'pki'}" in result.stderr.decode()
    assert not (tmp_path / "node7.pem").exists()


def test_the_node_environment_really_lacks_cryptography(tmp_path: Path, llmgw: Path, node_env: dict[str, str]) -> None:
    # Keeps the other tests honest: with node_env, the double cannot have used cryptography.
    result = subprocess.run([str(llmgw), "ctl", "cert", "init-ca", "--dir", str(tmp_path / "pki")],
                            capture_output=True, env=node_env, timeout=30)

    assert result.returncode == 1
    assert "needs the python package 'cryptography'" in result.stderr.decode()


# ---------------------------------------------------------------------------- release server


def start_release_server(
    processes: list[subprocess.Popen[bytes]], root: Path, log: Path, *args: str
) -> str:
    """Start `python -m lab.release_server` on 127.0.0.1, any port; return its base URL."""
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lab.release_server", "--root", str(root), "--bind", LOOPBACK, "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=stderr, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    processes.append(proc)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready, f"release server did not start: {log.read_text()}"
    line = proc.stdout.readline().decode()
    assert line.startswith("listening on "), line + log.read_text()
    return line.split()[2].rstrip("/")


def fetch(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET. No proxies: every request stays on 127.0.0.1 whatever the environment says."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def checksum_line(checksums: bytes, name: str) -> str:
    lines = [line for line in checksums.decode().splitlines() if line.endswith(f"  {name}")]
    assert len(lines) == 1, checksums
    return lines[0].split()[0]


def test_release_server_serves_a_release_and_a_tampered_one(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    amd64, arm64 = build_llmgw("v1.2.3"), build_llmgw("v1.2.3") + b"# arm64\n"
    publish_release(tmp_path / "releases", "v1.2.3", {"amd64": amd64, "arm64": arm64},
                    tamper={"arm64": b"#!/bin/sh\necho not llmgw\n"})
    log = tmp_path / "release-server.log"
    base = start_release_server(processes, tmp_path / "releases", log)

    _, checksums = fetch(f"{base}/v1.2.3/checksums.txt")
    _, good = fetch(f"{base}/v1.2.3/{release_name('v1.2.3', 'amd64')}")
    _, bad = fetch(f"{base}/v1.2.3/{release_name('v1.2.3', 'arm64')}")

    assert good == amd64
    assert hashlib.sha256(good).hexdigest() == checksum_line(checksums, "llmgw-v1.2.3-linux-amd64")
    assert hashlib.sha256(bad).hexdigest() != checksum_line(checksums, "llmgw-v1.2.3-linux-arm64")
    assert fetch(f"{base}/v9.9.9/{release_name('v9.9.9', 'amd64')}")[0] == 404
    assert fetch(f"{base}/v1.2.3/")[0] == 404  # no directory listing
    requests = log.read_text()
    assert "GET /v1.2.3/llmgw-v1.2.3-linux-amd64 200" in requests
    assert "GET /v9.9.9/llmgw-v9.9.9-linux-amd64 404" in requests


def test_release_server_over_https_is_trusted_only_with_the_cluster_ca(
    tmp_path: Path, pki_dir: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    publish_release(tmp_path / "releases", "v1.2.3", {"amd64": b"binary"})
    cert, key = pki.issue_server_cert(pki_dir, tmp_path / "srv", "releases", [LOOPBACK], [])
    base = start_release_server(processes, tmp_path / "releases", tmp_path / "log",
                                "--cert", str(cert), "--key", str(key), "--delay", "0.5")
    assert base.startswith("https://127.0.0.1:")

    started = time.monotonic()
    status, body = fetch(f"{base}/v1.2.3/checksums.txt", ssl.create_default_context(cafile=pki_dir / "ca.pem"))
    assert time.monotonic() - started >= 0.5
    assert (status, body) == (200, f"{hashlib.sha256(b'binary').hexdigest()}  llmgw-v1.2.3-linux-amd64\n".encode())

    pki.init_ca(tmp_path / "other-pki", cn="another CA")
    untrusting = ssl.create_default_context(cafile=tmp_path / "other-pki" / "ca.pem")
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock, pytest.raises(ssl.SSLCertVerificationError):
        untrusting.wrap_socket(sock, server_hostname=LOOPBACK).close()


def test_publish_release_refuses_to_tamper_with_an_arch_it_does_not_publish(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="riscv64"):
        publish_release(tmp_path, "v1.2.3", {"amd64": b"x"}, tamper={"riscv64": b"y"})
