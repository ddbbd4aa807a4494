"""An upgrade of this package changes no node: the guard for every change of the state's shape.

A stack is onboarded by the package as it was at each of ``BASES`` (``git archive`` of
its ``llmgw_pulumi``, first on ``PYTHONPATH``: the program imports it, and so
do the dynamic providers, whose processes the CLI starts with its own
environment). Then ``pulumi up`` runs with the package of this checkout and
the config unchanged. On every node nothing may change: no file rewritten
(inode, mtime, mode, owner, sha256), no agent restarted (same MainPID, and
the control plane sees no stream close), no certificate re-issued (same
serials), and no SSH connection is opened to any node (a state-side update
has nothing to ask a node); the CLI's change summary may only hold
state-side updates, and the preview after that `up` is empty. A `pulumi
refresh` then rewrites each record in this version's shape
(``state_version``), and finds no drift.

Reading an earlier record without its migration (``observed.migrate``) is
caught here: the providers would see no observation of the node, take it as
drift, and read the node (an SSH connection) to plan a repair.

That each `up` ran the code it was meant to is checked, not assumed: a probe
(a ``sitecustomize`` on ``PYTHONPATH``) logs where every ``llmgw_pulumi``
module each Python process imports comes from, and whether the process is the
program or a provider.

Add a commit to ``BASES`` when a release's state shape is one to upgrade from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, extract_tar, ssh, stack_config, wait_until
from tests.e2e.node_checks import agent_process, install_test_engine, node_files, serials, steps_taken

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

BASES = ("ca1dd75", "e80e071", "fc02334", "b870cc4", "953c63e")
"""The commits whose package writes state this checkout's package must take over without touching a node:
ca1dd75 (the first the test ran from), e80e071 (the last before the state model of observed.py: state version 0),
fc02334 (the last of state version 1: records by path with hex digests, AgentInstall keeping the texts of
agent.yaml and the unit) and b870cc4 (the last of state version 2: each AgentInstall's ``rollout`` holding the
stack's whole canary list; onboarded with ``llmgw:rollout``, see ROLLOUT_FROM) and 953c63e (the last whose
AgentInstall input held agent.yaml's two comment lines, whose NodeIdentity outputs repeated the host key it was told
beside the one it saw, and whose state held each provider pickled by its class)."""
UNSIGNED_BASES = ("ca1dd75",)
"""Bases that know no agent.signingKey: their stack is onboarded without one, and the key added for the upgrade."""
ROLLOUT_FROM = {"b870cc4": {"maxParallel": 2}, "953c63e": {"maxParallel": 2}}
"""Bases whose stack is onboarded with this ``llmgw:rollout`` (its canary: the first node), kept for the upgrade."""

STATE_SIDE = {"same", "update"}
"""The operations the upgrade's `up` may show on a node's resources: an update rewrites state, the node checks
above say it did no more."""
SHARD_PREFIX = "pulumi-python::llmgw-shard-"
"""The provider resources (processes) nodes are spread over: made or dropped, state only (steps_taken's keys)."""

PROBE = '''\
"""Test probe of tests/e2e/test_upgrade.py: where each llmgw_pulumi module this process imports comes from."""
import os
import sys


class _Where:
    def find_spec(self, name, path=None, target=None):
        if name != "llmgw_pulumi" and not name.startswith("llmgw_pulumi."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                role = "provider" if sys.argv[0].endswith(os.path.join("pulumi", "dynamic", "__main__.py")) else "program"
                fd = os.open(os.environ["LLMGW_IMPORT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, f"{os.getpid()}\\t{role}\\t{name}\\t{spec.origin}\\n".encode())
                os.close(fd)
                return spec
        return None


sys.meta_path.insert(0, _Where())
'''


def base_package(commit: str, into: Path) -> Path:
    """``llmgw_pulumi`` as it was at ``commit``, extracted under ``into``; skips without git or the commit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the upgrade test takes the earlier package from the history")
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone (a shallow clone? `git fetch --unshallow`): "
                    "the upgrade test needs the package as it was there")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "llmgw_pulumi"],
                             capture_output=True, check=True).stdout
    extract_tar(archive, into)
    assert (into / "llmgw_pulumi" / "__init__.py").is_file()
    return into


@dataclass(frozen=True)
class Imports:
    """What the probe logged for one CLI run: (role, module, file) per import."""

    rows: list[tuple[str, str, str]]

    @classmethod
    def read(cls, log: Path) -> Imports:
        lines = log.read_text().splitlines() if log.exists() else []
        return cls([(role, module, origin) for _, role, module, origin in (line.split("\t") for line in lines)])

    def roles(self) -> set[str]:
        return {role for role, _, _ in self.rows}

    def outside(self, package: Path) -> list[tuple[str, str, str]]:
        return [r for r in self.rows if not r[2].startswith(str(package) + os.sep)]

    def of(self, role: str, module: str) -> list[str]:
        return [origin for r, m, origin in self.rows if (r, m) == (role, module)]


def streams(cluster: Any, ids: set[str], since: int) -> dict[str, list[str]]:
    return {n: [e.outcome for e in cluster.control_plane.events[since:] if e.node_id == n] for n in sorted(ids)}


@pytest.mark.parametrize("base_commit", BASES)
def test_an_upgrade_from_the_base_commit_changes_no_node(cluster, hosts, new_stack, tmp_path, base_commit):
    base = base_package(base_commit, tmp_path / "base")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)

    keyed, operator_keyed, dev = hosts(3)
    engine = install_test_engine(keyed, cluster)
    nodes = [
        # keyOrigin node (the default), the release tag, an engine
        {"id": keyed.hostname, "address": keyed.addr, "engines": {"llamacpp": {"bin": engine}}},
        # keyOrigin operator, the release tag, agent.yaml overrides
        # (pinned to the host key read from its disk, as on a console: a key made here goes only to a known machine)
        {"id": operator_keyed.hostname, "address": operator_keyed.addr, "keyOrigin": "operator",
         "hostKey": (operator_keyed.read_file("/etc/ssh/ssh_host_ed25519_key.pub") or b"").decode().strip(),
         "mgmtAddr": operator_keyed.addr, "fabric": {"name": "ib-east", "hcas": ["mlx5_0"]},
         "discovery": {"ibRoot": "/run/ib"}},
        # a dev build, copied
        {"id": dev.hostname, "address": dev.addr, "agent": {"binary": str(cluster.dev_binary)}},
    ]
    fleet = [keyed, operator_keyed, dev]
    ids = {h.hostname for h in fleet}
    rollout = {**ROLLOUT_FROM[base_commit], "canary": [keyed.hostname]} if base_commit in ROLLOUT_FROM else None
    config = stack_config(cluster, fleet, nodes=nodes, **({"rollout": rollout} if rollout else {}))
    # A base that knows no agent.signingKey onboards without it; this package refuses a release nothing verifies,
    # so the operator adds the key with the upgrade: how a release is verified is never a change to a node.
    signed = base_commit not in UNSIGNED_BASES
    stack = new_stack(config if signed else {**config, "agent": {k: v for k, v in config["agent"].items()
                                                                 if k != "signingKey"}})

    # The base's package onboards the nodes.
    old_log = tmp_path / "imports-base.log"
    stack.env.update(PYTHONPATH=f"{base}:{probe}", LLMGW_IMPORT_LOG=str(old_log))
    first = stack.up()
    assert first.ok, first.output
    imports = Imports.read(old_log)
    assert imports.roles() == {"program", "provider"}, imports.rows
    assert imports.outside(base) == [], f"the first up imported the package from elsewhere than {base}"
    assert set(imports.of("provider", "llmgw_pulumi.providers.agent")) == {str(base / "llmgw_pulumi/providers/agent.py")}
    assert cluster.control_plane.wait_for(ids, timeout=30), cluster.control_plane.events[-6:]

    files = {h.hostname: node_files(h) for h in fleet}
    agents = {h.hostname: agent_process(h, cluster) for h in fleet}
    issued = serials(stack, fleet)
    mark = len(cluster.control_plane.events)
    connections = {h.hostname: h.passive_tcp_opens() for h in fleet}

    # This checkout's package takes over, the config unchanged (but for the signing key a base could not take).
    if not signed:
        stack.set_config(config)
    new_log = tmp_path / "imports-new.log"
    stack.env.update(PYTHONPATH=str(probe), LLMGW_IMPORT_LOG=str(new_log))
    upgrade = stack.up()
    assert upgrade.ok, upgrade.output
    opened = {h.hostname: h.passive_tcp_opens() - connections[h.hostname] for h in fleet}
    steps = steps_taken(upgrade)
    print(f"\nupgrade from {base_commit}: {upgrade.changes}; steps other than same: {steps}; connections: {opened}")
    imports = Imports.read(new_log)
    assert imports.roles() == {"program", "provider"}, imports.rows
    assert imports.outside(REPO / "llmgw_pulumi") == [], "the upgrade's up did not run this checkout's package"

    # Every node change is listed before the test fails, so that one run tells all an upgrade did.
    problems = [f"{n}: the upgrade's up opened {k} connection(s) to the node" for n, k in opened.items() if k]
    # Since the nodes share one provider process (llmgw_pulumi/stack/shards.py), the shards no node uses are
    # deleted and shard 0 is made if no node was in it: provider resources, in the state only.
    shard_steps = {k: v for k, v in steps.items() if k.startswith(SHARD_PREFIX)}
    node_steps = {k: v for k, v in steps.items() if k not in shard_steps}
    if any(not set(ops) <= STATE_SIDE for ops in node_steps.values()):
        problems.append(f"the upgrade's up shows {upgrade.changes}, steps {node_steps}")
    if any(ops not in (["create"], ["delete"]) for ops in shard_steps.values()):
        problems.append(f"the upgrade's up did more than make or drop shards: {shard_steps}")
    for h in fleet:
        now = node_files(h)
        changed = sorted(p for p in files[h.hostname].keys() | now.keys() if files[h.hostname].get(p) != now.get(p))
        if changed:
            problems.append(f"{h.hostname}: rewrote or changed {changed}: "
                            f"{ {p: (files[h.hostname].get(p), now.get(p)) for p in changed} }")
    restarted = {h.hostname: (agents[h.hostname], agent_process(h, cluster)) for h in fleet}
    problems += [f"{n}: the agent restarted (MainPID, start) {was} -> {now}" for n, (was, now) in restarted.items()
                 if was != now]
    reissued = serials(stack, fleet)
    problems += [f"{n}: certificate re-issued (state, node serial) {issued[n]} -> {now}" for n, now in reissued.items()
                 if issued[n] != now]
    # The control plane's view: no stream of these nodes closed since the first up. A restart made now, on
    # purpose, is seen as one close and one accept per node: had the upgrade restarted an agent, its close
    # (and its reconnect) would be in the list besides these.
    for h in fleet:
        assert ssh(h, cluster, "sudo systemctl restart llmgw-agent")[0] == 0
    assert wait_until(lambda: all({"closed", "accepted"} <= set(s) for s in streams(cluster, ids, mark).values()), 30), \
        streams(cluster, ids, mark)
    problems += [f"{n}: the control plane saw its stream end and open again during the upgrade: {sorted(s)}"
                 for n, s in streams(cluster, ids, mark).items() if sorted(s) != ["accepted", "closed"]]
    assert problems == [], "the upgrade changed nodes:\n" + "\n".join(problems) + "\n" + upgrade.output
    if rollout:  # each AgentInstall now holds its share of llmgw:rollout, not the canary list
        shares = {r["urn"].split("::")[-1]: r["inputs"]["rollout"] for r in stack.export()["resources"]
                  if r["type"].endswith("AgentInstall")}
        assert {n: (s.get("canary"), "canaries" in s) for n, s in shares.items()} == {
            h.hostname: (h is keyed, False) for h in fleet}, shares

    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output

    # A refresh reads every node and records it in this version's shape: no drift, nothing to do.
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    records = [(r["urn"], r["outputs"]) for r in stack.export()["resources"]
               if r["type"].endswith(("NodeIdentity", "AgentInstall"))]
    assert len(records) == 2 * len(fleet), [urn for urn, _ in records]
    for urn, outs in records:
        assert outs.get("state_version") == 3 and "observed" in outs, (urn, outs)
        assert not {"node_state", "files"} & set(outs), (urn, outs)
        assert not any(name.startswith("/") for name in outs["observed"]["files"]), (urn, outs["observed"])
        if urn.split("::")[-2].endswith("AgentInstall"):
            assert outs["agent_yaml"].startswith("sha256:") and outs["unit"].startswith("sha256:"), (urn, outs)
            if rollout:  # version 2's canary list, read back as the node's share
                assert set(outs["rollout"]) == {"max_parallel", "canary", "directory"}, (urn, outs["rollout"])
    after_refresh = stack.preview(expect_no_changes=True)
    assert after_refresh.ok, after_refresh.output
