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
