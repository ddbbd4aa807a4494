"""Onboarding under the real engine on real-systemd hosts: every SPEC item, checked on the hosts.

Each test boots its own hosts, writes a stack config as an operator would,
runs `pulumi up`, and then looks at the hosts from outside (their overlay
dirs) and over SSH, and at the control-plane test double.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import paramiko
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from lab.doubles.llmgw import build_llmgw
from llmgw_pulumi.certificates import pki
from tests.conftest import RELEASE, TAMPERED_RELEASE, resource_count, said, ssh, stack_config, up_when

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

TLS = {"ca": "/etc/llmgw/ca.pem", "cert": "/etc/llmgw/agent.pem", "key": "/etc/llmgw/agent-key.pem"}


def assert_unit_as_the_spec_says(text: str) -> None:
    """SPEC step 8, directive by directive (comments and blank lines aside, nothing else)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line, [])
        else:
            assert current is not None, f"a directive before any section: {line}"
            current.append(line)
    assert set(sections) == {"[Unit]", "[Service]", "[Install]"}, sections
    assert {"After=network-online.target", "Wants=network-online.target"} <= set(sections["[Unit]"])
    assert sorted(d for d in sections["[Service]"]) == sorted([
        "ExecStart=/usr/local/bin/llmgw agent --config /etc/llmgw/agent.yaml",
        "KillMode=process", "Restart=on-failure", "RestartSec=2s", "StateDirectory=llmgw-agent"]), sections["[Service]"]
    assert sections["[Install]"] == ["WantedBy=multi-user.target"]


def assert_onboarded(host, cluster, node_id: str, binary: bytes, config: dict) -> None:
    """Every item of SPEC steps 3-8 on one host."""
    ca_pem = (cluster.pki_dir / "ca.pem").read_text()

    d = host.stat("/etc/llmgw")
    assert (d.st_mode & 0o777, d.st_uid, d.st_gid) == (0o755, 0, 0)
    for path, mode in [("/etc/llmgw/ca.pem", 0o644), ("/etc/llmgw/agent.pem", 0o644), ("/etc/llmgw/agent-key.pem", 0o600),
                       ("/usr/local/share/ca-certificates/llmgw-ca.crt", 0o644), ("/etc/llmgw/agent.yaml", 0o644),
                       ("/usr/local/bin/llmgw", 0o755), ("/etc/systemd/system/llmgw-agent.service", 0o644)]:
        st = host.stat(path)
        assert st is not None, f"{node_id}: {path} missing"
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (mode, 0, 0), f"{node_id}: {path} mode/owner"

    assert host.read_file("/etc/llmgw/ca.pem").decode() == ca_pem
    assert host.read_file("/usr/local/share/ca-certificates/llmgw-ca.crt").decode() == ca_pem
    # update-ca-certificates ran: the root is in the system bundle.
    assert ca_pem.strip().splitlines()[1] in host.read_file("/etc/ssl/certs/ca-certificates.crt").decode()

    cert_pem = host.read_file("/etc/llmgw/agent.pem").decode()
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == node_id
    assert pki.verify_issued(ca_pem, cert_pem)
    key = serialization.load_pem_private_key(host.read_file("/etc/llmgw/agent-key.pem"), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()

    assert hashlib.sha256(host.read_file("/usr/local/bin/llmgw")).hexdigest() == hashlib.sha256(binary).hexdigest()
    assert_unit_as_the_spec_says(host.read_file("/etc/systemd/system/llmgw-agent.service").decode())
    text = host.read_file("/etc/llmgw/agent.yaml").decode()
    assert text.startswith(f"# {node_id}, written by llmgw-pulumi")
    assert yaml.safe_load(text) == config

    rc, out = ssh(host, cluster, "systemctl is-active llmgw-agent; systemctl is-enabled llmgw-agent")
    assert out.split() == ["active", "enabled"], out


def test_three_nodes_onboard_with_one_up(cluster, hosts, new_stack):
    a, b, c = hosts(3, hostnames=["ip-10-250-0-a", "node-b", "node-c"])
    engines = {"llamacpp": {"bin": "/usr/bin/python3"}, "sglang": {"python": "/usr/bin/python3"}}
    config = stack_config(cluster, [a, b, c], nodes=[
        {"id": "gpu-a", "address": a.addr},                                   # hostname differs from node id
        {"id": "node-b", "address": b.addr, "engines": engines,
         "fabric": {"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}},
        {"id": "node-c", "address": c.addr, "agent": {"binary": str(cluster.dev_binary)}},  # a developer build
    ])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output
    print(f"\npulumi up, 3 nodes: {up.seconds:.1f}s")

    server = cluster.control_plane.address
    release = build_llmgw(RELEASE)
    assert_onboarded(a, cluster, "gpu-a", release, {"server": server, "tls": TLS, "node_id": "gpu-a"})
    assert_onboarded(b, cluster, "node-b", release, {
        "server": server, "tls": TLS, "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}],
        "engines": {"llamacpp": {"bin": "/usr/bin/python3"}, "sglang": {"python": "/usr/bin/python3"}}})
    assert_onboarded(c, cluster, "node-c", cluster.dev_binary.read_bytes(), {"server": server, "tls": TLS})

    # Each agent holds a mutual-TLS stream to the control plane under its node id.
    assert cluster.control_plane.wait_for({"gpu-a", "node-b", "node-c"}, timeout=15), cluster.control_plane.events
    accepted = {e.node_id: e.cn for e in cluster.control_plane.events if e.outcome == "accepted"}
    assert all(accepted[n] == n for n in ("gpu-a", "node-b", "node-c"))
    assert stack.outputs()["node-b"]["engine_problems"] == []

    # Nothing to do now, and finding that out costs no SSH connection.
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    before = [h.passive_tcp_opens() for h in (a, b, c)]
    again = stack.up()
    assert again.ok, again.output
    assert again.result.summary.resource_changes == {"same": resource_count(["gpu-a", "node-b", "node-c"])}, again.output
    assert [h.passive_tcp_opens() for h in (a, b, c)] == before, "a no-op up opened SSH connections"


def test_standby_first_the_agent_ends_on_the_second_server(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], servers=[cluster.standby.address, cluster.control_plane.address])
    up = new_stack(config).up()
    assert up.ok, up.output
    assert yaml.safe_load(h.read_file("/etc/llmgw/agent.yaml"))["servers"] == [cluster.standby.address, cluster.control_plane.address]
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)
    assert any(e.node_id == h.hostname and e.outcome == "refused standby" for e in cluster.standby.events)
    assert h.hostname not in cluster.standby.connected()


def test_tampered_release_is_refused_and_nothing_installed(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], agent={"version": TAMPERED_RELEASE, "releaseUrl": cluster.release_url,
                                               "signingKey": cluster.release_signing_key})
    up = new_stack(config).up()
    assert not up.ok
    assert "ChecksumMismatchError" in up.output, up.output
    assert "nothing was installed" in up.output
    for path in ("/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service"):
        assert h.read_file(path) is None, f"{path} installed from a tampered release"
    # Where the install stages the download, as its script says (and the places earlier versions used). /run is
    # the node's own tmpfs, not in the upper dir: looked at over SSH, and seen to show a staging dir when one is there.
    places = " ".join(staging_dirs())
    look = f"sudo find {places} -maxdepth 1 -name 'llmgw-stage.*' 2>/dev/null; true"
    assert ssh(h, cluster, look)[1].split() == [], "staging dir left behind"
    probe = f"{staging_dirs()[0]}/llmgw-stage.probe"
    assert ssh(h, cluster, f"sudo mkdir {probe}")[0] == 0
    assert ssh(h, cluster, look)[1].split() == [probe], f"a staging dir in {places} is not seen"


def staging_dirs() -> list[str]:
    """The directory install-agent.sh makes its staging dir in (``mktemp -d``), then those earlier versions used."""
    from llmgw_pulumi.nodestate import commands

    found = re.findall(r'mktemp -d "\$R(/[^"]*)/llmgw-stage\.X+"', commands.script_text("install-agent.sh"))
    assert len(found) == 1, "install-agent.sh no longer makes its staging dir with mktemp -d \"$R/DIR/llmgw-stage.X...\""
    return [found[0], *(d for d in ("/run", "/var/tmp") if d != found[0])]


def _broken_engine(tmp: Path) -> Path:
    """A real ELF binary that cannot start: it needs a shared library the test hosts do not have."""
    (tmp / "dep.c").write_text("int llmgw_test_dep(void) { return 0; }\n")
    (tmp / "main.c").write_text("int llmgw_test_dep(void);\nint main(void) { return llmgw_test_dep(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp / "libllmgwtestdep.so", tmp / "dep.c"], check=True)
    subprocess.run(["gcc", "-o", tmp / "llama-server", tmp / "main.c", f"-L{tmp}", "-lllmgwtestdep"], check=True)
    return tmp / "llama-server"


def _upload(host, cluster, local: Path, remote: str, mode: str) -> None:
    """Put a file on a host the way an operator would: scp to /tmp, sudo install."""
    t = paramiko.Transport((host.addr, 22))
    t.connect(username="deploy", pkey=paramiko.Ed25519Key.from_private_key_file(str(cluster.ssh_key_path)))
    sftp = paramiko.SFTPClient.from_transport(t)
    sftp.put(str(local), "/tmp/upload")
    t.close()
    rc, out = ssh(host, cluster, f"sudo install -D -m {mode} /tmp/upload '{remote}'")
    assert rc == 0, out


def test_engine_problems_are_reported_and_the_node_stays_onboarded(cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    broken = _broken_engine(tmp_path)
    assert subprocess.run([broken], env={"LD_LIBRARY_PATH": str(tmp_path)}).returncode == 0, "runs where its library is"
    _upload(h, cluster, broken, "/opt/llama cpp/llama-server", "0755")   # a path with a space
    _upload(h, cluster, broken, "/opt/vllm/bin/vllm", "0644")             # not executable
    engines = {"llamacpp": {"bin": "/opt/llama cpp/llama-server"}, "vllm": {"bin": "/opt/vllm/bin/vllm"},
               "sglang": {"python": "/opt/sglang/bin/python3"}}          # missing
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": engines}])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output

    problems = {p["engine"]: p for p in stack.outputs()[h.hostname]["engine_problems"]}
    assert {e: p["status"] for e, p in problems.items()} == {"llamacpp": "fails", "vllm": "not-executable", "sglang": "missing"}
    assert "libllmgwtestdep.so" in problems["llamacpp"]["problem"]
    assert "ldd \"'/opt/llama cpp/llama-server'\" | grep 'not found'" in problems["llamacpp"]["hint"]
    # Shown in `pulumi up` as warnings on the node's EngineCheck, with the hint.
    assert "warning: llamacpp at /opt/llama cpp/llama-server exists but will not run" in up.output
    assert "hint: usually a missing shared library" in up.output
    # Still onboarded.
    assert ssh(h, cluster, "systemctl is-active llmgw-agent")[1].strip() == "active"

    # With failOnEngineProblems the same problems fail the deployment.
    stack.set_config({**config, "failOnEngineProblems": True,
                      "nodes": [{**config["nodes"][0], "failOnEngineProblems": True}]})
    strict = stack.up()
    assert not strict.ok
    assert "EngineWillNotRunError" in strict.output, strict.output


def test_a_host_that_accepts_ssh_only_after_20s_is_onboarded(cluster, hosts, new_stack):
    (h,) = hosts(1, start=False)
    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 90})
    up = up_when(new_stack(config), lambda events, seconds: seconds >= 20 and said(events, "waiting up to 90s for ssh"),
                 h.start)
    assert up.ok, up.output
    assert up.seconds >= 20
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)


def test_a_host_that_never_accepts_ssh_fails_with_the_scripts_message(cluster, hosts, new_stack):
    (h,) = hosts(1, start=False)
    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 5})
    up = new_stack(config).up()
    assert not up.ok
    assert f"cannot reach deploy@{h.addr} over ssh after 5s" in up.output


def test_a_changed_host_key_is_refused(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    stack = new_stack(config)
    assert stack.up().ok

    def recorded_host_key() -> str:
        return next(r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity"))["outputs"]["host_key"]

    old_key = recorded_host_key()
    h.regenerate_host_keys()
    if not h.running:
        h.start()
    stack.set_config({**config, "servers": [cluster.control_plane.address, cluster.standby.address]})
    up = stack.up()
    assert not up.ok
    assert "presented host key SHA256:" in up.output and "was recorded when the node was onboarded" in up.output, up.output
    # The record, read again after the refused run, still holds the key of the machine that was onboarded.
    assert recorded_host_key() == old_key
    assert old_key.split()[1] not in h.read_file(f"/etc/ssh/ssh_host_{old_key.split()[0][4:]}_key.pub").decode()


@pytest.mark.parametrize("user,words", [("pwsudo", "sudo asks pwsudo for a password"), ("nosudo", "sudo")])
def test_sudo_that_is_not_passwordless_is_a_clear_error(cluster, hosts, new_stack, user, words):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ssh={"user": user, "privateKeyPath": str(cluster.ssh_key_path), "wait": 30})
    up = new_stack(config).up()
    assert not up.ok
    assert words in up.output and "passwordless sudo" in up.output
    assert h.read_file("/etc/llmgw/agent-key.pem") is None


def test_a_pinned_host_key_wins(cluster, hosts, new_stack):
    a, b = hosts(2)
    # Pinned as an operator copies it from the machine: its ECDSA key, the type the
    # client would not pick first on its own.
    a_key = " ".join(a.read_file("/etc/ssh/ssh_host_ecdsa_key.pub").decode().split()[:2])
    b_key = " ".join(b.read_file("/etc/ssh/ssh_host_ecdsa_key.pub").decode().split()[:2])
    stack = new_stack(stack_config(cluster, [a], nodes=[{"id": a.hostname, "address": a.addr, "hostKey": b_key}]))
    up = stack.up()
    assert not up.ok
    assert "was pinned; refusing to connect" in up.output
    assert a.read_file("/etc/llmgw/agent-key.pem") is None

    stack.set_config(stack_config(cluster, [a], nodes=[{"id": a.hostname, "address": a.addr, "hostKey": a_key}]))
    up = stack.up()
    assert up.ok, up.output
    recorded = [r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity")][0]["outputs"]["host_key"]
    assert recorded == a_key
