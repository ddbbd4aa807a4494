"""llmgw:registration under the `pulumi` CLI on lab hosts: the control plane must list each node once its agent
starts, asked with `llmgw ctl nodes` (the llmgw double, against the cluster's control-plane double, over mutual
TLS with an operator certificate of the cluster CA).

Each listing the control plane answers is one of its events, under the asker's certificate CN: this test's
operator CN is its own, so the events count exactly the registration commands this test's stack ran.
"""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from lab import pki as labpki
from llmgw_pulumi.nodestate import desired
from tests.conftest import ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

TIMEOUT = 20


def listings(cluster: Any, cn: str) -> int:
    """How many times the control plane answered `ctl nodes` for ``cn``."""
    return sum(1 for e in list(cluster.control_plane.events) if e.cn == cn and e.outcome.startswith("listed"))


def put_on_node(host: Any, cluster: Any, path: str, data: bytes) -> None:
    """Overwrite a root-owned file on the node (its mode and owner kept), over SSH as the operator would."""
    encoded = base64.b64encode(data).decode()
    rc, out = ssh(host, cluster, f"echo {encoded} | base64 -d | sudo -n tee {path} >/dev/null")
    assert rc == 0, out


def errors_of(run: Any) -> str:
    return "\n".join(d.get("message", "") for d in run.diagnostics("error"))


def test_registration_is_checked_at_the_control_plane_and_a_refused_certificate_fails_the_node(
        hosts: Any, cluster: Any, new_stack: Any, tmp_path: Path) -> None:
    good, refused = hosts(2)
    operator_cn = f"operator-{uuid.uuid4().hex[:8]}"
    cert, key = labpki.issue_client_cert(cluster.pki_dir, tmp_path / "operator", operator_cn)
    command = [str(cluster.dev_binary), "ctl", "nodes", "--server", cluster.control_plane.address,
               "--ca", str(cluster.pki_dir / labpki.CA_CERT), "--cert", str(cert), "--key", str(key)]
    config = stack_config(cluster, [good, refused], registration={"command": command, "timeoutSeconds": TIMEOUT})
    stack = new_stack(config)

    # A preview runs no registration command.
    preview = stack.preview()
    assert preview.ok, preview.output
    assert listings(cluster, operator_cn) == 0

    # Onboarding: each node's AgentInstall asks the control plane, which lists both.
    first = stack.up()
    assert first.ok, first.output
    asked = listings(cluster, operator_cn)
    assert asked >= 2, cluster.control_plane.events  # once per node at least (again while not listed yet)
    confirmed = sorted(d.get("urn", "") for d in first.diagnostics("debug")
                       if "the control plane lists it" in d.get("message", ""))
    assert [urn.rsplit("::", 1)[-1] for urn in confirmed] == sorted(h.hostname for h in (good, refused)), confirmed
    assert "the control plane lists it" not in first.output  # said once per node, in the event log, not printed
    assert all("/llmgw:AgentInstall::" in urn for urn in confirmed), confirmed
    assert {good.hostname, refused.hostname} <= cluster.control_plane.connected()

    # A no-op `up` reaches no node and runs no registration command.
    opens = [h.passive_tcp_opens() for h in (good, refused)]
    noop = stack.up()
    assert noop.ok, noop.output
    assert noop.changes.get("update", 0) == 0 and noop.changes.get("create", 0) == 0, noop.changes
    assert [h.passive_tcp_opens() for h in (good, refused)] == opens
    assert listings(cluster, operator_cn) == asked

    # The second node's certificate and key are swapped for a pair from another CA, which the control plane does
    # not trust; a change to its agent.yaml restarts its agent, and the control plane refuses its certificate.
    other = tmp_path / "other-pki"
    labpki.init_ca(other, cn="another CA")
    foreign_cert, foreign_key = labpki.issue_client_cert(other, tmp_path / "foreign", refused.hostname)
    put_on_node(refused, cluster, desired.CERT_PATH, foreign_cert.read_bytes())
    put_on_node(refused, cluster, desired.KEY_PATH, foreign_key.read_bytes())
    config["nodes"][1]["mgmtAddr"] = refused.addr
    stack.set_config(config)
    before = len(cluster.control_plane.events)
    started = time.monotonic()
    failed = stack.up()
    took = time.monotonic() - started

    assert not failed.ok, failed.output
    errors = errors_of(failed)
    # The node named, what was run, what it printed (the listing, without the node), and the fix.
    assert f"{refused.hostname}: " in errors and f"did not list {refused.hostname} within {TIMEOUT} s" in errors, errors
    assert " ".join(command) in errors, errors
    assert "| NODE" in errors and f"| {good.hostname}" in errors and f"| {refused.hostname}" not in errors, errors
    assert "fix:" in errors and "journalctl -u llmgw-agent" in errors and "certificate" in errors, errors
    failing = {d.get("urn", "").rsplit("::", 1)[-1] for d in failed.diagnostics("error") if d.get("urn")}
    assert refused.hostname in failing and good.hostname not in failing, failing
    assert TIMEOUT - 2 <= took < TIMEOUT + 120, took  # it waited for the timeout, and not much longer
    tls_refusals = [e for e in cluster.control_plane.events[before:] if e.outcome.startswith("tls-failed")]
    assert tls_refusals, cluster.control_plane.events[before:]  # the control plane refused the foreign certificate
    assert refused.hostname not in cluster.control_plane.connected()
    assert good.hostname in cluster.control_plane.connected()
