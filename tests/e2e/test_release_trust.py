"""Releases are installed only as the operator's side approved them (issue 17, item 2), on real hosts under the CLI.

The operator's side (the program, once per `pulumi up`) fetches checksums.txt over https and verifies its
OpenSSH signature with agent.signingKey, or takes agent.sha256 pins; each node downloads only the binary, checks
that sha256 and that `--version` reports the tag, before anything is installed. With agent.fetch: operator the
release is downloaded on the operator's side and pushed to nodes that cannot reach the release server.

Every release here is published by the test itself into a root of its own, served by a release server of its
own (HTTPS, certificate from the cluster CA) that logs each request, so requests can be counted.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab.doubles.llmgw import build_llmgw
from lab.release_server import corrupt_signature, make_signing_key, publish_release, serving
from llmgw_pulumi.releases.policy import UNVERIFIED_WARNING
from llmgw_pulumi.stack.shards import SHARDS_ENV
from tests.conftest import RELEASE, REPO, SPREAD, extract_tar, shard, stack_config
from tests.e2e.node_checks import steps_taken

BINARY, CONFIG, UNIT = "/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service"
UPGRADE_FROM = "ca1dd75"
"""The commit whose state an upgrade of the package must leave alone (tests/e2e/test_release_trust.py)."""
PORT = 8451


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def release_server(lab: Any, cluster: Any, root: Path, log: Path, port: int = PORT) -> Iterator[str]:
    """A release server serving ``root`` over HTTPS (certificate from the cluster CA) in the cluster release
    server's netns, logging each request to ``log``; yields its base URL."""
    from lab import pki as labpki

    addr = cluster.release_url.split("//")[1].rsplit(":", 1)[0]
    cert, key = labpki.issue_server_cert(cluster.pki_dir, log.parent / f"tls-{port}", "releases-trust", ips=[addr], dns=[])
    with open(log, "wb") as stderr, serving(lab, root, addr, port, cert, key, log=stderr) as url:
        yield url


def requests(log: Path, path: str) -> int:
    """GET requests for ``path`` that the release server logged."""
    return sum(1 for line in log.read_text().splitlines() if line.split()[:2] == ["GET", path])


def untouched(h: Any) -> bool:
    return all(h.read_file(p) is None for p in (BINARY, CONFIG, UNIT, "/etc/llmgw/agent.pem"))


# --------------------------------------------------------------------------- signed releases


def ids_in_two_shards() -> list[str]:
    """Two node ids whose resources run in different provider processes (what once per process would not catch)."""
    first = "trust-a"
    second = next(f"trust-{i}" for i in range(100) if shard(f"trust-{i}", SPREAD) != shard(first, SPREAD))
    return [first, second]


def test_a_signed_release_is_fetched_once_per_up_and_previews_offline(lab, cluster, hosts, new_stack, tmp_path):
    a, b = hosts(2)
    root, log = tmp_path / "releases", tmp_path / "server.log"
    publish_release(root, RELEASE, {"amd64": build_llmgw(RELEASE)}, sign_with=cluster.release_signing_key_path)
    with release_server(lab, cluster, root, log) as url:
        config = stack_config(cluster, [a, b], ids=ids_in_two_shards(),
                              agent={"version": RELEASE, "releaseUrl": url, "signingKey": cluster.release_signing_key})
        stack = new_stack(config)
        stack.env[SHARDS_ENV] = str(SPREAD)  # the two nodes in two provider processes
        up = stack.up()
        assert up.ok, up.output
        assert "approved from checksums.txt signed by SHA256:" in up.output, up.output
        # Once per up for the whole stack, not per node; each node downloads only its binary.
        assert requests(log, f"/{RELEASE}/checksums.txt") == 1, log.read_text()
        assert requests(log, f"/{RELEASE}/checksums.txt.sig") == 1, log.read_text()
        assert requests(log, f"/{RELEASE}/llmgw-{RELEASE}-linux-amd64") == 2, log.read_text()
        for h in (a, b):
            assert h.read_file(BINARY) == build_llmgw(RELEASE)
        again = stack.up()
        assert again.ok and set(again.changes) == {"same"}, again.output
        assert requests(log, f"/{RELEASE}/checksums.txt") == 2, log.read_text()
    # A reviewer's preview: no release server at all (it is stopped), and no change shown.
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output
    assert "cannot download" not in preview.output


def _tampered_but_consistent(root: Path, tag: str, key: Path) -> tuple[bytes, bytes]:
    """A release the operator approved (signed by ``key``), then replaced on the server by an attacker:
    another binary and a checksums.txt that matches it; the signature is the one of the real checksums.txt.
    Returns (the real binary, the evil one)."""
    real, evil = build_llmgw(tag), build_llmgw(tag) + b"\n# a backdoor\n"
    publish_release(root, tag, {"amd64": real}, sign_with=key)
    signature = (root / tag / "checksums.txt.sig").read_bytes()
    publish_release(root, tag, {"amd64": evil})
    (root / tag / "checksums.txt.sig").write_bytes(signature)
    return real, evil


@pytest.mark.parametrize("approval", ["signingKey", "sha256", "neither"])
def test_a_tampered_binary_with_a_matching_checksums_txt(approval, lab, cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    tag = "v1.8.0"
    root, log = tmp_path / "releases", tmp_path / "server.log"
    real, evil = _tampered_but_consistent(root, tag, cluster.release_signing_key_path)
    assert sha(evil) in (root / tag / "checksums.txt").read_text()  # the checksums match what is served
    agent: dict[str, Any] = {"version": tag}
    if approval == "signingKey":
        agent["signingKey"] = cluster.release_signing_key
    elif approval == "sha256":
        agent["sha256"] = {"amd64": sha(real)}
    with release_server(lab, cluster, root, log) as url:
        stack = new_stack(stack_config(cluster, [h], agent={**agent, "releaseUrl": url}))
        opened = h.passive_tcp_opens()
        up = stack.up()
    if approval == "neither":
        # Refused before anything happens, in the preview and in `up`: the node, the field and the fix are named,
        # and no TCP connection reached the node (nor the release server).
        for run in (stack.preview(), up):
            assert not run.ok, run.output
            assert f"node {h.hostname}: agent.signingKey: is missing" in run.output, run.output
            assert "pulumi config set --path llmgw:agent.signingKey" in run.output, run.output
        assert h.passive_tcp_opens() == opened, "a node was reached although the release was refused"
        assert requests(log, f"/{tag}/checksums.txt") == 0
        assert untouched(h)
        # The control: under the opt-out it is trusted as the server sends it (https only), and the tampered
        # release goes in, with a warning under the node.
        with release_server(lab, cluster, root, log) as url:
            stack.set_config(stack_config(cluster, [h], agent={**agent, "releaseUrl": url, "allowUnverifiedRelease": True}))
            up = stack.up()
        assert up.ok, up.output
        assert f"{h.hostname} {UNVERIFIED_WARNING}" in up.output, up.output
        assert h.read_file(BINARY) == evil
        return
    assert not up.ok, up.output
    if approval == "signingKey":
        assert "does not verify with agent.signingKey" in up.output, up.output
        assert h.passive_tcp_opens() == opened, "a node was reached although the release was refused"
        assert requests(log, f"/{tag}/llmgw-{tag}-linux-amd64") == 0
    else:
        assert "ChecksumMismatchError" in up.output and f"but {sha(real)} was expected; nothing was installed" \
            in up.output, up.output
    for path in (BINARY, CONFIG, UNIT):
        assert h.read_file(path) is None, f"{path} installed from a tampered release"


def test_a_bad_signature_is_refused_before_any_node_is_touched(lab, cluster, hosts, new_stack, tmp_path):
    a, b = hosts(2)
    tag = "v1.8.1"
    root, log = tmp_path / "releases", tmp_path / "server.log"
    publish_release(root, tag, {"amd64": build_llmgw(tag)}, sign_with=cluster.release_signing_key_path)
    corrupt_signature(root, tag)
    with release_server(lab, cluster, root, log) as url:
        stack = new_stack(stack_config(cluster, [a, b], agent={"version": tag, "releaseUrl": url,
                                                              "signingKey": cluster.release_signing_key}))
        opened = {h.hostname: h.passive_tcp_opens() for h in (a, b)}
        up = stack.up()
    assert not up.ok
    assert f"the signature of {url}/{tag}/checksums.txt does not verify with agent.signingKey" in up.output, up.output
    assert "fix: do not install it" in up.output
    assert {h.hostname: h.passive_tcp_opens() for h in (a, b)} == opened, "a node was reached"
    assert all(untouched(h) for h in (a, b))
    # Signed by another key (the attacker's own, well-formed): refused the same way.
    other, _ = make_signing_key(tmp_path / "other-key")
    publish_release(root, tag, {"amd64": build_llmgw(tag)}, sign_with=other)
    with release_server(lab, cluster, root, log) as url:
        again = stack.up()
    assert not again.ok and "does not verify with agent.signingKey" in again.output, again.output
    assert {h.hostname: h.passive_tcp_opens() for h in (a, b)} == opened


def test_a_binary_that_reports_another_version_is_refused(lab, cluster, hosts, new_stack, tmp_path):
    (h,) = hosts(1)
    tag = "v1.9.0"
    root, log = tmp_path / "releases", tmp_path / "server.log"
    # An old build published under a new tag: its checksums.txt matches it and is properly signed.
    publish_release(root, tag, {"amd64": build_llmgw(RELEASE)}, sign_with=cluster.release_signing_key_path)
    agent = {"version": tag, "signingKey": cluster.release_signing_key}
    with release_server(lab, cluster, root, log) as url:
        stack = new_stack(stack_config(cluster, [h], agent={**agent, "releaseUrl": url}))
        # A private release server: its CA given in the stack config, nothing in the environment.
        del stack.env["SSL_CERT_FILE"]
        untrusted = stack.up()
        assert not untrusted.ok and "CERTIFICATE_VERIFY_FAILED" in untrusted.output, untrusted.output
        assert untouched(h)
        stack.set_config(stack_config(cluster, [h], agent={**agent, "releaseUrl": url,
                                                           "releaseCa": str(cluster.pki_dir / "ca.pem")}))
        up = stack.up()
        assert requests(log, f"/{tag}/llmgw-{tag}-linux-amd64") == 1  # it was downloaded, then refused
    assert not up.ok
    assert f"llmgw binary for amd64 reports version '{RELEASE}', not {tag}; nothing was installed" in up.output, up.output
    assert "ReleaseVersionError" in up.output
    for path in (BINARY, CONFIG, UNIT):
        assert h.read_file(path) is None, f"{path} installed from a mislabelled release"
    rc = subprocess.run(["find", str(h.upper / "usr" / "local" / "bin"), "-name", "llmgw*"], capture_output=True,
                        text=True, check=True)
    assert rc.stdout == "", rc.stdout  # not even a staged copy is left


# --------------------------------------------------------------------------- air-gapped nodes


@pytest.fixture
def private_control_plane(lab, cluster):
    from lab.control_plane import ControlPlane

    cp = ControlPlane(cluster.pki_dir, f"{lab.private_subnet}.4", netns=lab.add_netns("rcp", 4, segment="private")).start()
    yield cp
    cp.stop()


def reaches(host: Any, addr: str, port: int) -> bool:
    from lab.hosts import entered_netns

    with entered_netns(host.netns):
        try:
            socket.create_connection((addr, port), timeout=3).close()
        except OSError:
            return False
    return True


def test_nodes_without_a_route_to_the_release_server_are_onboarded_with_fetch_operator(
        lab, cluster, hosts, new_stack, private_control_plane, tmp_path):
    (bastion,) = hosts(1, segment="both")
    nodes = hosts(2, segment="private")
    root, log = tmp_path / "releases", tmp_path / "server.log"
    publish_release(root, RELEASE, {"amd64": build_llmgw(RELEASE)}, sign_with=cluster.release_signing_key_path)
    with release_server(lab, cluster, root, log) as url:
        addr = url.split("//")[1].rsplit(":", 1)[0]
        assert reaches(bastion, addr, PORT)  # the positive control: the server is up and reachable from the main side
        assert not any(reaches(h, addr, PORT) for h in nodes), "a private node reaches the release server"
        ssh = {"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 60, "jump": f"deploy@{bastion.addr}"}
        agent = {"version": RELEASE, "releaseUrl": url, "signingKey": cluster.release_signing_key}
        # Without fetch: operator the nodes cannot get it.
        stack = new_stack(stack_config(cluster, nodes, servers=[private_control_plane.address], ssh=ssh, agent=agent))
        stack.env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # where the operator's side keeps what it downloads
        failed = stack.up()
        assert not failed.ok and "cannot download" in failed.output, failed.output
        assert requests(log, f"/{RELEASE}/llmgw-{RELEASE}-linux-amd64") == 0
        stack.set_config(stack_config(cluster, nodes, servers=[private_control_plane.address], ssh=ssh,
                                      agent={**agent, "fetch": "operator"}))
        up = stack.up()
        assert up.ok, up.output
        # Downloaded once for both nodes (one architecture), verified here, pushed over SSH.
        assert requests(log, f"/{RELEASE}/llmgw-{RELEASE}-linux-amd64") == 1, log.read_text()
    for h in nodes:
        assert h.read_file(BINARY) == build_llmgw(RELEASE)
    assert private_control_plane.wait_for({h.hostname for h in nodes}, timeout=30), private_control_plane.events[-5:]
    again = stack.preview(expect_no_changes=True)  # the release server is gone: nothing to fetch in a preview
    assert again.ok, again.output


# --------------------------------------------------------------------------- upgrading the package


def _old_package(tmp_path: Path) -> Path | None:
    """llmgw_pulumi as it was at UPGRADE_FROM, unpacked into a directory for PYTHONPATH; None outside a checkout."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(REPO), "archive", UPGRADE_FROM, "llmgw_pulumi"], capture_output=True)
    if done.returncode != 0:
        return None
    target = tmp_path / "old-package"
    extract_tar(done.stdout, target)
    return target


def test_state_written_by_the_previous_package_is_left_alone(lab, cluster, hosts, new_stack, tmp_path):
    old = _old_package(tmp_path)
    if old is None:
        pytest.skip(f"needs git and the commit {UPGRADE_FROM}")
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    # UPGRADE_FROM knows no agent.signingKey; this package refuses a release nothing verifies, so the operator
    # adds the key with the upgrade (how a release is verified is never a change to a node).
    stack = new_stack({**config, "agent": {k: v for k, v in config["agent"].items() if k != "signingKey"}})
    stack.env["PYTHONPATH"] = str(old)
    first = stack.up()
    assert first.ok, first.output
    assert "approved" not in first.output  # the old package indeed ran
    inode = h.stat(BINARY).st_ino
    assert cluster.control_plane.wait_for({h.hostname}, timeout=20)
    streams = len(cluster.control_plane.events)
    del stack.env["PYTHONPATH"]
    stack.set_config(config)
    up = stack.up()
    assert up.ok, up.output
    assert "approved from checksums.txt" in up.output  # the new package ran
    # No step on the node's resources; its provider resource (process) may change, state only (stack/shards.py).
    steps = steps_taken(up)
    assert {k: v for k, v in steps.items() if not k.startswith("pulumi-python::llmgw-shard-")} == {}, steps
    assert all(ops in (["create"], ["delete"]) for ops in steps.values()), steps
    assert h.stat(BINARY).st_ino == inode, "the binary was rewritten"
    assert [e for e in cluster.control_plane.events[streams:] if e.node_id == h.hostname] == [], "the agent restarted"
