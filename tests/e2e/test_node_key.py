"""The node's key is made on the node and never leaves it; nodes onboarded by the script are taken over as they are.

Under the real engine on real-systemd hosts. The operator's side is
everything under the test's tmp dir: the project directory, PULUMI_HOME and
the file backend (state, history, backups), plus every CLI output and the
stack outputs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from lab import seed
from tests.conftest import RELEASE, ssh, stack_config, wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

KEY_PATH = "/etc/llmgw/agent-key.pem"
CERT_PATH = "/etc/llmgw/agent.pem"
RENEW_EVERY_UP = {"validityHours": 1, "renewBeforeHours": 0.999}
SCRIPT_FILES = ("/etc/llmgw/ca.pem", CERT_PATH, KEY_PATH, "/usr/local/share/ca-certificates/llmgw-ca.crt",
                "/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service")


def key_needles(key_pem: bytes) -> list[bytes]:
    """What would give a copy of the key away: each line of its base64 body (a copy re-wrapped differently
    would still hold most of them), and the base64 of its DER body as one line."""
    lines = [line for line in key_pem.splitlines() if line and not line.startswith(b"-----")]
    return [*lines, b"".join(lines)]


def found_on_operator_side(root: Path, needles: list[bytes], texts: list[str]) -> list[str]:
    hits = [f"CLI output or stack outputs #{i}" for i, text in enumerate(texts) if any(n.decode() in text for n in needles)]
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [str(path) for n in needles if n in data][:1]
    return hits


def main_pid(host, cluster) -> str:
    return ssh(host, cluster, "systemctl show -p MainPID --value llmgw-agent")[1].strip()


def test_the_key_is_born_on_the_node_and_never_leaves_it(cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h], certificate=RENEW_EVERY_UP))
    opens = h.passive_tcp_opens()
    first = stack.up()
    assert first.ok, first.output
    # Making the key on the node, signing, installing identity and agent and checking engines: one SSH connection.
    assert h.passive_tcp_opens() - opens == 1, "onboarding with the key made on the node took more than one connection"
    key1 = h.read_file(KEY_PATH)
    assert key1 and b"PRIVATE KEY" in key1
    cert1 = x509.load_pem_x509_certificate(h.read_file(CERT_PATH) or b"")
    node_key = serialization.load_pem_private_key(key1, None)
    assert node_key.public_key() == cert1.public_key(), "the certificate is not the node's key's"
    assert wait_until(lambda: h.hostname in cluster.control_plane.connected(), 20), "the control plane refused the node"

    t_renewal = time.time()
    renewal = stack.up()                         # inside the renewal window: a new pair, made on the node again
    assert renewal.ok, renewal.output
    key2 = h.read_file(KEY_PATH)
    cert2 = x509.load_pem_x509_certificate(h.read_file(CERT_PATH) or b"")
    assert key2 and key2 != key1 and cert2.serial_number != cert1.serial_number
    assert serialization.load_pem_private_key(key2, None).public_key() == cert2.public_key()
    st = h.stat(KEY_PATH)
    assert st is not None and (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, 0, 0)
    assert h.read_file("/etc/llmgw/agent-key.pending.pem") is None, "the new pair was not swapped in"
    assert wait_until(lambda: any(e.node_id == h.hostname and e.outcome == "accepted" and e.time > t_renewal
                                  for e in cluster.control_plane.events), 20), "the renewed node was not accepted"

    state = stack.export_raw()
    outputs = stack.outputs()
    assert "PRIVATE KEY" not in state, "a private key in state"
    for r in stack.export()["resources"]:
        held = {**(r.get("inputs") or {}), **(r.get("outputs") or {})}
        assert "key_pem" not in held, f"a node key in the state of {r['urn']} (even encrypted: it crossed the network)"
    hits = found_on_operator_side(tmp_path, key_needles(key1) + key_needles(key2),
                                  [first.output, renewal.output, state, repr(outputs)])
    assert hits == [], hits


def test_a_node_without_openssl_is_told_the_fix_or_keeps_its_key_on_the_operator_side(cluster, hosts, new_stack):
    (h,) = hosts(1)
    rc, out = ssh(h, cluster, "sudo mv /usr/bin/openssl /usr/bin/openssl.away")
    assert rc == 0, out
    try:
        config = stack_config(cluster, [h])
        # Without openssl update-ca-certificates cannot trust the cluster CA, so the node could not download a
        # release from a server it certifies: the local build is copied instead.
        config["agent"] = {"binary": str(cluster.dev_binary)}
        stack = new_stack(config)
        failed = stack.up()
        assert not failed.ok
        assert f"{h.hostname}: the node has no openssl to make its key pair with" in failed.output, failed.output
        assert "keyOrigin: operator" in failed.output and "apt-get install openssl" in failed.output
        assert h.read_file(KEY_PATH) is None and h.read_file("/etc/llmgw/agent-key.pending.pem") is None

        config["nodes"][0]["keyOrigin"] = "operator"
        stack.set_config(config)
        # A key made here is sent only to a machine vouched for: unpinned, it is refused before anything is sent.
        opens = h.passive_tcp_opens()
        unpinned = stack.up()
        assert not unpinned.ok and "hostKey: keyOrigin operator sends the node's private key" in unpinned.output, \
            unpinned.output
        assert h.read_file(KEY_PATH) is None and h.passive_tcp_opens() == opens, "the node was reached"
        # Pinned to the lab host's own key, read from its disk as an operator reads it on the console.
        config["nodes"][0]["hostKey"] = (h.read_file("/etc/ssh/ssh_host_ed25519_key.pub") or b"").decode()
        stack.set_config(config)
        ok = stack.up()
        assert ok.ok, ok.output
        assert h.passive_tcp_opens() > opens
        key = h.read_file(KEY_PATH) or b""
        assert serialization.load_pem_private_key(key, None).public_key() == \
            x509.load_pem_x509_certificate(h.read_file(CERT_PATH) or b"").public_key()
        # keyOrigin operator: the key is in state, as a secret (never in plaintext).
        assert not [n for n in key_needles(key) if n.decode() in stack.export_raw()]
    finally:
        ssh(h, cluster, "sudo mv /usr/bin/openssl.away /usr/bin/openssl")


def test_a_node_the_script_onboarded_is_taken_over_without_a_change(cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    binary = seed.operator_binary(tmp_path / "operator" / "llmgw", RELEASE)
    with seed.openssh_env(cluster.ssh_key_path) as env:
        done = seed.onboard(h.hostname, h.addr, env, server=cluster.control_plane.address, pki_dir=cluster.pki_dir,
                            binary=binary, release_url=cluster.release_url, ssh_wait=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_until(lambda: h.hostname in cluster.control_plane.connected(), 20), "the script's agent did not connect"
    serial = x509.load_pem_x509_certificate(h.read_file(CERT_PATH) or b"").serial_number
    pid = main_pid(h, cluster)
    before = {p: h.stat(p) for p in SCRIPT_FILES}
    assert all(before.values()), before
    key = h.read_file(KEY_PATH) or b""

    stack = new_stack(stack_config(cluster, [h]))
    run = stack.up()
    assert run.ok, run.output

    after = {p: h.stat(p) for p in SCRIPT_FILES}
    changed = [p for p in SCRIPT_FILES if (after[p].st_ino, after[p].st_mtime_ns) != (before[p].st_ino, before[p].st_mtime_ns)]  # type: ignore[union-attr]
    assert changed == [], f"rewritten: {changed}"
    assert x509.load_pem_x509_certificate(h.read_file(CERT_PATH) or b"").serial_number == serial, "re-issued"
    assert main_pid(h, cluster) == pid, "the agent was restarted"
    assert h.hostname in cluster.control_plane.connected()
    assert stack.outputs()[h.hostname]["certificate_adopted"] is True
    # The key onboard-node.sh made is the node's now: it is not taken into state.
    assert not [n for n in key_needles(key) if n.decode() in stack.export_raw()]
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
