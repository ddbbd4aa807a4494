"""Lifecycle under the real engine on real-systemd hosts: what operators run for years against the same nodes.

Each scenario asserts the host state after each step and `pulumi preview
--expect-no-changes` after each `up`.
"""

from __future__ import annotations

import base64
import re
import time

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from lab.doubles.llmgw import build_llmgw
from tests.conftest import NEXT_RELEASE, resource_count, shard, ssh, stack_config, wait_until
from tests.e2e.node_checks import install_test_engine

pytestmark = [pytest.mark.hosts, pytest.mark.engine]


def up_clean(stack):
    """`pulumi up`, then a preview that must find nothing to do."""
    run = stack.up()
    assert run.ok, run.output
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    return run


def serial_on(host) -> int:
    return x509.load_pem_x509_certificate(host.read_file("/etc/llmgw/agent.pem")).serial_number


def main_pid(host, cluster) -> str:
    return ssh(host, cluster, "systemctl show -p MainPID --value llmgw-agent")[1].strip()


def test_preview_names_what_changes_and_updates_happen_in_place(cluster, hosts, new_stack):
    a, b = hosts(2)
    config = stack_config(cluster, [a, b])
    stack = new_stack(config)
    up_clean(stack)
    serial, pid = serial_on(a), main_pid(a, cluster)

    # Change only node a's settings: servers, engines, fabric, discovery and management overrides.
    changed = dict(config["nodes"][0], servers=[cluster.standby.address, cluster.control_plane.address],
                   engines={"llamacpp": {"bin": "/usr/bin/python3"}}, fabric={"name": "ib-west", "hcas": ["mlx5_2"]},
                   discovery={"ibRoot": "/run/ib"}, mgmtAddr=a.addr, mgmtInterface="eth0")
    stack.set_config({**config, "nodes": [changed, config["nodes"][1]]})
    preview = stack.preview(diff=True)
    assert preview.ok, preview.output
    changes = preview.result.change_summary
    assert changes.get("update") == 2 and "replace" not in changes and "create" not in changes, preview.output
    assert f"llmgw:AgentInstall::{a.hostname}" in preview.output
    assert f"llmgw:EngineCheck::{a.hostname}" in preview.output
    assert f"::{b.hostname}]" not in preview.output, "node b's resources appear in the preview"
    # The rendered agent.yaml is an input: the preview shows its change, as YAML.
    assert re.search(r"~ agent_yaml\s*: \(yaml\)", preview.output), preview.output
    assert '+ mgmt_interface: "eth0"' in preview.output

    up_clean(stack)
    doc = yaml.safe_load(a.read_file("/etc/llmgw/agent.yaml"))
    assert doc["servers"] == [cluster.standby.address, cluster.control_plane.address]
    assert doc["fabrics"] == [{"name": "ib-west", "hcas": ["mlx5_2"]}]
    assert doc["discovery"] == {"ib_root": "/run/ib"} and doc["mgmt_interface"] == "eth0"
    assert serial_on(a) == serial, "nothing re-issued"
    assert main_pid(a, cluster) != pid, "agent restarted"
    assert cluster.control_plane.wait_for({a.hostname}, timeout=15)

    # A version change installs the new release, verified, and restarts the agent.
    stack.set_config({**config, "agent": {"version": NEXT_RELEASE, "releaseUrl": cluster.release_url,
                                          "signingKey": cluster.release_signing_key},
                      "nodes": [changed, config["nodes"][1]]})
    up_clean(stack)
    for h in (a, b):
        assert h.read_file("/usr/local/bin/llmgw") == build_llmgw(NEXT_RELEASE)
        assert ssh(h, cluster, "/usr/local/bin/llmgw --version")[1].split()[-1] == NEXT_RELEASE


def test_new_node_id_on_the_same_host_replaces_without_losing_files(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], ids=["gpu-old"])
    stack = new_stack(config)
    up_clean(stack)
    stack.set_config(stack_config(cluster, [h], ids=["gpu-new"]))
    run = up_clean(stack)
    # The old node's component and four resources (and its provider shard, if the new id hashes elsewhere).
    assert run.result.summary.resource_changes.get("delete") == 5 + (shard("gpu-old") != shard("gpu-new")), run.output
    cert = x509.load_pem_x509_certificate(h.read_file("/etc/llmgw/agent.pem"))
    assert cert.subject.rfc4514_string() == "CN=gpu-new"
    for path in ("/etc/llmgw/agent-key.pem", "/etc/llmgw/ca.pem", "/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml",
                 "/usr/local/share/ca-certificates/llmgw-ca.crt", "/etc/systemd/system/llmgw-agent.service"):
        assert h.read_file(path) is not None, f"{path} was removed by the old node's delete"
    assert yaml.safe_load(h.read_file("/etc/llmgw/agent.yaml"))["node_id"] == "gpu-new"
    assert cluster.control_plane.wait_for({"gpu-new"}, timeout=15)


def test_a_replaced_vm_is_onboarded_and_the_old_one_let_go(cluster, hosts, new_stack):
    old, new = hosts(2)
    config = stack_config(cluster, [old], ids=["gpu-vm"],
                          ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 5})
    stack = new_stack(config)
    up_clean(stack)
    old.stop()  # the old VM is gone: new address, new host key
    stack.set_config({**config, "nodes": [{"id": "gpu-vm", "address": new.addr}]})
    preview = stack.preview()
    # Another machine: its own key pair and certificate, identity, agent and engine check.
    assert preview.result.change_summary.get("replace") == 4, preview.output
    run = up_clean(stack)
    assert "assuming the machine is gone" in run.output
    assert x509.load_pem_x509_certificate(new.read_file("/etc/llmgw/agent.pem")).subject.rfc4514_string() == "CN=gpu-vm"
    key = [r for r in stack.export()["resources"] if r["type"].endswith("NodeIdentity")][0]["outputs"]["host_key"]
    assert key.split()[1] in new.read_file("/etc/ssh/ssh_host_ed25519_key.pub").decode()


def test_certificate_renewal_inside_the_window(cluster, hosts, new_stack):
    (h,) = hosts(1)
    # 216 s certificates renewed in their last 150 s: due 66 s after issue, time
    # enough for the first up and its clean preview even on a loaded machine (30 s was not, with more test processes).
    renew_before = 150
    config = stack_config(cluster, [h], certificate={"validityHours": 0.06, "renewBeforeHours": renew_before / 3600})
    stack = new_stack(config)
    up_clean(stack)
    first = serial_on(h)
    not_after = x509.load_pem_x509_certificate(h.read_file("/etc/llmgw/agent.pem")).not_valid_after_utc
    time.sleep(max(0.0, (not_after.timestamp() - renew_before) - time.time()) + 1)
    preview = stack.preview(diff=True)
    assert preview.ok, preview.output
    summary = preview.result.change_summary
    # The certificate is issued again in place (the same machine: its recorded host key is expected) and the
    # identity updated; the agent is not shown as changing. The preview says why, under the certificate.
    assert summary.get("update") == 2 and "replace" not in summary, preview.output
    assert "inside its renewal window" in preview.output and "a machine presenting another host key is refused" \
        in preview.output, preview.output
    accepted_before = sum(1 for e in cluster.control_plane.events if e.node_id == h.hostname and e.outcome == "accepted")
    up_clean(stack)
    assert serial_on(h) != first
    assert wait_until(lambda: sum(1 for e in cluster.control_plane.events
                                  if e.node_id == h.hostname and e.outcome == "accepted") > accepted_before, 15), \
        "the agent did not reconnect with the renewed identity"


def test_refresh_shows_drift_and_up_repairs_exactly_that(cluster, hosts, new_stack):
    (h,) = hosts(1)
    engine = install_test_engine(h, cluster)
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": {"llamacpp": {"bin": engine}}}])
    stack = new_stack(config)
    up_clean(stack)
    good = {p: h.read_file(p) for p in ("/etc/llmgw/agent.yaml", "/usr/local/bin/llmgw")}
    serial = serial_on(h)

    rc, out = ssh(h, cluster, "sudo rm /etc/llmgw/agent-key.pem && echo 'mgmt_addr: 1.2.3.4' | sudo tee -a /etc/llmgw/agent.yaml "
                              "&& echo '# replaced' | sudo tee -a /usr/local/bin/llmgw && sudo systemctl disable --now llmgw-agent "
                              f"&& sudo chmod 644 {engine}")
    assert rc == 0, out
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    # The certificate's key is gone from the node, the identity and the agent drifted; the engine check records the
    # problem it found (a standing problem, so not an update: see the next assertion and the preview below).
    assert refresh.result.summary.resource_changes.get("update") == 3, refresh.output
    checks = [r for r in stack.export()["resources"] if r["type"].endswith("EngineCheck")]
    assert [p["status"] for p in checks[0]["outputs"]["problems"]] == ["not-executable"]

    preview = stack.preview()
    # The node makes a new key pair and gets its certificate; the identity and the agent are repaired; the engine's
    # problem is a standing warning, not a change.
    summary = preview.result.change_summary
    assert summary.get("update") == 3 and "replace" not in summary, preview.output
    assert "the node no longer holds the certificate's key" in preview.output, preview.output
    assert "not an executable file" in preview.output
    # The engine is the operator's to fix; the rest `pulumi up` repairs.
    assert ssh(h, cluster, f"sudo chmod 755 {engine}")[0] == 0
    up_clean(stack)
    for path, content in good.items():
        assert h.read_file(path) == content, f"{path} not repaired"
    key = serialization.load_pem_private_key(h.read_file("/etc/llmgw/agent-key.pem") or b"", None)
    cert = x509.load_pem_x509_certificate(h.read_file("/etc/llmgw/agent.pem") or b"")
    assert key.public_key() == cert.public_key() and cert.serial_number != serial, "the key was not made anew"
    assert ssh(h, cluster, "systemctl is-active llmgw-agent; systemctl is-enabled llmgw-agent")[1].split() == ["active", "enabled"]


def test_a_node_gone_for_good_is_kept_by_refresh_and_let_go_when_removed_from_the_config(cluster, hosts, new_stack):
    (h, other) = hosts(2)
    # A short ssh.wait: the node is gone, so refresh and the removal each wait it out in full; its length is not
    # what this guards (test_fleet.py's late login user is waited for).
    config = stack_config(cluster, [h, other], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path),
                                                    "wait": 5})
    stack = new_stack(config)
    up_clean(stack)
    h.stop()
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    # No answer is not proof of absence: refresh keeps the node's resources, with a warning.
    assert "delete" not in refresh.changes, refresh.output
    assert f"{h.hostname}: cannot reach deploy@{h.addr}" in refresh.output and "kept as it was" in refresh.output
    # Taking it out of the config lets it go; the other node is untouched.
    stack.set_config({**config, "nodes": [n for n in config["nodes"] if n["id"] == other.hostname]})
    run = stack.up()
    assert run.ok, run.output
    assert run.changes.get("delete", 0) >= 5, run.changes  # its Node and four resources (and its shard, if alone there)
    assert "assuming the machine is gone" in run.output
    assert ssh(other, cluster, "systemctl is-active llmgw-agent")[1].strip() == "active"


def test_destroy_removes_everything_and_leaves_engines_running(cluster, hosts, new_stack):
    (h,) = hosts(1)
    engine = install_test_engine(h, cluster)
    stack = new_stack(stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": {"llamacpp": {"bin": engine}}}]))
    up_clean(stack)
    assert wait_until(lambda: ssh(h, cluster, f"pgrep -f '{engine} serve'")[0] == 0, 10), "agent did not launch the engine"
    engine_pid = ssh(h, cluster, f"pgrep -f '{engine} serve'")[1].split()[0]

    down = stack.destroy()
    assert down.ok, down.output
    for path in ("/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service",
                 "/etc/llmgw/agent.pem", "/etc/llmgw/agent-key.pem", "/etc/llmgw/ca.pem", "/etc/llmgw",
                 "/usr/local/share/ca-certificates/llmgw-ca.crt", "/etc/ssl/certs/llmgw-ca.pem",
                 "/etc/systemd/system/multi-user.target.wants/llmgw-agent.service"):
        assert h.read_file(path) is None and h.stat(path) is None, f"{path} left behind"
    ca_line = (cluster.pki_dir / "ca.pem").read_text().splitlines()[1]
    assert ca_line not in h.read_file("/etc/ssl/certs/ca-certificates.crt").decode(), "CA still trusted"
    assert ssh(h, cluster, "systemctl is-active llmgw-agent")[1].strip() in ("inactive", "unknown")
    assert ssh(h, cluster, f"test -d /proc/{engine_pid} && echo alive")[1].strip() == "alive", "destroy killed the engine"


def test_preview_on_a_reviewers_machine_without_ssh_key_or_ca_key(cluster, hosts, new_stack, tmp_path):
    import shutil

    (h,) = hosts(1)
    # The stack names the same PKI dir and key path for everyone; on a reviewer's
    # machine the CA key and the SSH key are simply not there.
    pki_dir, key_path = tmp_path / "pki", tmp_path / "id_ed25519"
    shutil.copytree(cluster.pki_dir, pki_dir)
    reviewer_pki = pki_dir
    hidden = tmp_path / "ca-key.pem.elsewhere"
    (pki_dir / "ca-key.pem").rename(hidden)
    config = stack_config(cluster, [h], pkiDir=str(pki_dir),
                          ssh={"user": "deploy", "privateKeyPath": str(key_path), "wait": 10})
    stack = new_stack(config)
    preview = stack.preview()
    assert preview.ok, preview.output
    assert preview.result.change_summary.get("create") == resource_count([h.hostname])
    assert "previewing without it" in preview.output
    up = stack.up()
    assert not up.ok
    assert "ssh.privateKeyPath" in up.output and str(key_path) in up.output

    # With the SSH key but still no CA key: creation fails, clearly, before the node is touched.
    shutil.copy(cluster.ssh_key_path, key_path)
    up = stack.up()
    assert not up.ok
    assert f"no authority in {reviewer_pki} (ca-key.pem missing); create one first" in up.output
    assert h.read_file("/etc/llmgw/agent-key.pem") is None

    # The operator onboards; then a reviewer's preview, without either key, shows no changes.
    hidden.rename(pki_dir / "ca-key.pem")
    up_clean(stack)
    (pki_dir / "ca-key.pem").rename(hidden)
    key_path.unlink()
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output

    # Without the PKI dir itself, or only without its ca.pem: a warning in preview; `up` refuses before any node.
    shutil.copy(cluster.ssh_key_path, key_path)
    hidden.rename(pki_dir / "ca-key.pem")
    for missing, shown in ((pki_dir, f"cannot read {pki_dir}: it is not a directory"),
                           (pki_dir / "ca.pem", f"cannot read {pki_dir / 'ca.pem'}: it does not exist")):
        missing.rename(tmp_path / "moved")
        preview = stack.preview(expect_no_changes=True)
        assert preview.ok, preview.output
        assert f"llmgw: pkiDir: {shown}; previewing without it; `pulumi up` refuses it" in preview.output, preview.output
        opens = h.passive_tcp_opens()
        up = stack.up()
        assert not up.ok
        assert f"llmgw: pkiDir: {shown}" in up.output and "fix: point llmgw:pkiDir at" in up.output, up.output
        assert h.passive_tcp_opens() == opens and not up.changes.get("update"), "a node was reached"
        (tmp_path / "moved").rename(missing)


def _key_bodies(*pems: str) -> list[str]:
    """The base64 lines of PEM bodies: what would show if a key leaked."""
    return [line for pem in pems for line in pem.splitlines() if line and not line.startswith("-----") and len(line) > 40]


def test_no_private_key_or_passphrase_in_state_or_output(cluster, hosts, new_stack):
    from lab.stack import PASSPHRASE

    (h,) = hosts(1)
    # keyOrigin operator: the node's key is a secret in state (made on the node, it is not in state at all:
    # tests/e2e/test_node_key.py). A key made here is sent only to a pinned (or recorded) host key: the lab host's
    # own, read from its disk as an operator reads it on the console.
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "keyOrigin": "operator",
                                                "hostKey": h.read_file("/etc/ssh/ssh_host_ed25519_key.pub").decode()}])
    stack = new_stack(config)
    up_clean(stack)
    stack.set_config({**config, "servers": [cluster.control_plane.address, cluster.standby.address]})
    up_clean(stack)
    assert stack.refresh().ok
    exported = stack.export_raw()
    at_rest = "\n".join(p.read_text(errors="replace") for p in stack.state_files())
    assert '"ciphertext"' in exported and len(at_rest) > 1000
    node_key = h.read_file("/etc/llmgw/agent-key.pem").decode()
    secrets = _key_bodies((cluster.pki_dir / "ca-key.pem").read_text(), node_key, cluster.ssh_key_path.read_text())
    assert secrets
    state_bytes = len(exported)
    for line in secrets:
        assert line not in exported, "a private key is in plaintext in `pulumi stack export`"
        assert line not in at_rest, "a private key is in plaintext in the state files"
        assert line not in stack.all_output(), "a private key is in the CLI output"
    assert PASSPHRASE not in exported and PASSPHRASE not in at_rest and PASSPHRASE not in stack.all_output()
    providers = {r["inputs"].get("__provider") for r in stack.export()["resources"] if "__provider" in r.get("inputs", {})}
    modules = ("certificate", "identity", "agent", "engines")
    # One provider per resource class, each of them by reference: its module's one instance (``PROVIDER``), no code,
    # no path.
    assert sorted(m for p in providers for m in modules
                  if f"llmgw_pulumi.providers.{m}\x94".encode("latin-1") in base64.b64decode(p)) == sorted(modules), providers
    for p in providers:
        decoded = base64.b64decode(p)
        # Protocol 4, one frame: the module's name and PROVIDER, looked up (STACK_GLOBAL), and nothing else.
        assert re.fullmatch(rb"\x80\x04\x95.{8}\x8c.llmgw_pulumi\.providers\.[a-z]+\x94\x8c\x08PROVIDER\x94\x93\x94\.",
                            decoded, re.DOTALL), decoded
    print(f"\nstate: {state_bytes} bytes for 1 node")
    assert stack.destroy().ok
    at_rest = "\n".join(p.read_text(errors="replace") for p in stack.state_files())
    for line in secrets:
        assert line not in stack.all_output() and line not in at_rest
