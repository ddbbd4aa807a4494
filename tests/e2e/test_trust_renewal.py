"""Renewal reaches only the machine already known (the trust issue, item 1).

Under the real engine and CLI on real-systemd hosts. A node is onboarded with
certificates renewed at every `up` once they are a few seconds old. Then its
address is moved to another lab host, which has other SSH host keys and would
accept the operator's login and run anything (as a substituted machine would):
the renewal `pulumi up` is refused with the fix text, nothing is signed (the
certificate in state is the same), nothing is made on that machine. With the
address back on the real node, the same `up` renews it normally.
"""

from __future__ import annotations

import base64
import datetime as dt
import shutil
import subprocess
import time

import paramiko
import pytest

from tests.conftest import stack_config, wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

RENEW_SOON = {"validityHours": 1, "renewBeforeHours": 0.999}
"""Renewal is due 3.6 s after a certificate is issued."""
NODE_FILES = ("/etc/llmgw", "/etc/llmgw/agent-key.pem", "/etc/llmgw/agent-key.pending.pem", "/etc/llmgw/agent.pem")


def move_address(addr: str, from_host, to_host) -> None:
    """The address leaves one host's eth0 for another's; the bridge side forgets where it was."""
    subprocess.run(["ip", "-n", from_host.netns, "addr", "del", f"{addr}/24", "dev", "eth0"], check=True)
    subprocess.run(["ip", "-n", to_host.netns, "addr", "add", f"{addr}/24", "dev", "eth0"], check=True)
    subprocess.run(["ip", "neigh", "flush", "to", addr], check=True)


def presented_key(addr: str) -> str:
    """The host key the machine answering at ``addr`` presents, as an SSH client sees it (no login)."""
    with paramiko.Transport((addr, 22)) as t:
        t.start_client(timeout=10)
        key = t.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"


def fingerprint(host_key: str) -> str:
    key_type, blob = host_key.split()[:2]
    return str(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)).fingerprint)


def certificate_state(stack) -> dict:
    (cert,) = [r for r in stack.export()["resources"] if r["type"].endswith("ClientCertificate")]
    return cert


def step_lines(run, resource: str) -> str:
    """The CLI's lines naming a resource type (`~ ... ClientCertificate node updated (1s)`)."""
    return "\n".join(line for line in run.output.splitlines() if resource in line)


def test_another_machine_at_the_address_is_refused_and_the_real_node_renews_once_back(cluster, hosts, new_stack):
    node, impostor = hosts(2)
    addr = node.addr
    stack = new_stack(stack_config(cluster, [node], certificate=RENEW_SOON))
    first = stack.up()
    assert first.ok, first.output
    assert wait_until(lambda: node.hostname in cluster.control_plane.connected(), 20), "the node did not connect"
    before = certificate_state(stack)
    recorded = before["outputs"]["host_key"]
    assert recorded.split()[1] in (node.read_file(f"/etc/ssh/ssh_host_{recorded.split()[0].removeprefix('ssh-')}"
                                                  "_key.pub") or b"").decode()
    due = dt.datetime.fromisoformat(before["outputs"]["not_after"]).timestamp() - RENEW_SOON["renewBeforeHours"] * 3600
    time.sleep(max(0.0, due - time.time()) + 1)  # into the renewal window

    impostor_opens = impostor.passive_tcp_opens()
    move_address(addr, node, impostor)
    try:
        other = presented_key(addr)
        assert other.split()[1] != recorded.split()[1], "the impostor presents the node's key: nothing is tested"
        refused = stack.up()
    finally:
        move_address(addr, impostor, node)
    assert not refused.ok, refused.output
    assert impostor.passive_tcp_opens() - impostor_opens >= 2, "the refused up did not reach the other machine"
    out = refused.output
    assert f"presented host key {fingerprint(other)}" in out and "was recorded when the node was onboarded" in out, out
    # The fix: confirm the key on the machine itself, and how to declare a re-imaged machine; never "just pin it".
    assert "ssh-keygen -lf /etc/ssh/ssh_host_" in out and "on its console" in out, out
    assert "replace_with" in out and "--replace" in out and "hostKey" in out, out
    assert "a new certificate is issued (the certificate expires" in out, out  # why the certificate was due
    # Nothing signed: the certificate in state is the one issued at onboarding, and only it.
    after = certificate_state(stack)
    for key in ("serial", "cert_pem", "not_after", "host_key"):
        assert after["outputs"][key] == before["outputs"][key], key
    assert after["id"] == before["id"]
    # Nothing made on the other machine: no key pair, not even /etc/llmgw (the real node shows the check sees them).
    assert [p for p in NODE_FILES if impostor.stat(p) is not None] == []
    assert node.stat("/etc/llmgw/agent-key.pem") is not None

    # The real node back at its address: the same `up` renews it, expecting (and seeing) its recorded key.
    assert wait_until(lambda: presented_key(addr) == recorded, 10), "the real node does not answer at its address"
    t_back = time.time()
    renewed = stack.up()
    assert renewed.ok, renewed.output
    steps = step_lines(renewed, "ClientCertificate")
    assert "updated" in steps and "replaced" not in steps, renewed.output  # the same resource, updated in place
    now = certificate_state(stack)
    assert now["outputs"]["serial"] != before["outputs"]["serial"] and now["outputs"]["host_key"] == recorded
    assert (node.read_file("/etc/llmgw/agent.pem") or b"").decode() == now["outputs"]["cert_pem"]
    assert node.stat("/etc/llmgw/agent-key.pending.pem") is None, "the new key pair was not swapped in"
    assert wait_until(lambda: any(e.node_id == node.hostname and e.outcome == "accepted" and e.time > t_back
                                  for e in cluster.control_plane.events), 20), "the renewed node was not accepted"
    assert [p for p in NODE_FILES if impostor.stat(p) is not None] == []


def own_host_key(host, recorded: str) -> str:
    """The host's key of the recorded type, read from its disk: as an operator reads it on the machine's console."""
    pub = host.read_file(f"/etc/ssh/ssh_host_{recorded.split()[0].removeprefix('ssh-')}_key.pub") or b""
    return " ".join(pub.decode().split()[:2])


def test_new_host_keys_are_refused_until_the_confirmed_key_is_pinned(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], certificate=RENEW_SOON)
    stack = new_stack(config)
    assert stack.up().ok
    before = certificate_state(stack)
    recorded = before["outputs"]["host_key"]
    h.regenerate_host_keys()  # the same machine, its identity intact, with new host keys
    new_key = own_host_key(h, recorded)
    assert new_key and new_key != recorded
    refused = stack.up()      # due for renewal: refused, nothing signed
    assert not refused.ok and f"presented host key {fingerprint(new_key)}" in refused.output, refused.output
    assert certificate_state(stack)["outputs"]["serial"] == before["outputs"]["serial"]

    config["nodes"][0]["hostKey"] = new_key  # confirmed on the machine, then pinned
    stack.set_config(config)
    t_pinned = time.time()
    pinned = stack.up()
    assert pinned.ok, pinned.output
    now = certificate_state(stack)
    assert now["outputs"]["serial"] != before["outputs"]["serial"]
    assert (h.read_file("/etc/llmgw/agent.pem") or b"").decode() == now["outputs"]["cert_pem"]
    assert wait_until(lambda: any(e.node_id == h.hostname and e.outcome == "accepted" and e.time > t_pinned
                                  for e in cluster.control_plane.events), 20), "the node was not accepted"


def test_a_reimaged_machine_is_onboarded_afresh_once_declared(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    stack = new_stack(config)
    assert stack.up().ok
    recorded = certificate_state(stack)["outputs"]["host_key"]
    # Re-imaged: a fresh disk (no /etc/llmgw) and new host keys.
    h.stop()
    shutil.rmtree(h.upper / "etc/llmgw")
    h.regenerate_host_keys()
    h.start()
    new_key = own_host_key(h, recorded)
    assert new_key != recorded and h.stat("/etc/llmgw") is None

    config["nodes"][0]["hostKey"] = new_key  # confirmed on its console, pinned
    stack.set_config(config)
    urns = [r["urn"] for r in stack.export()["resources"]
            if r["type"].rsplit(":", 1)[-1] in ("ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck")]
    assert len(urns) == 4, urns
    t_declared = time.time()
    declared = stack._engine(["up", "--yes", "--skip-preview", *(a for u in urns for a in ("--replace", u))], None)
    assert declared.ok, declared.output
    identity = next(r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity"))
    assert identity["outputs"]["host_key"] == new_key
    assert h.stat("/etc/llmgw/agent-key.pem") is not None
    assert wait_until(lambda: any(e.node_id == h.hostname and e.outcome == "accepted" and e.time > t_declared
                                  for e in cluster.control_plane.events), 20), "the re-imaged node was not accepted"
    assert stack.preview(expect_no_changes=True).ok
