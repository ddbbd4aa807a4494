"""Safe fleet-wide upgrades (llmgw:rollout) under the real CLI, on real hosts, seen from the control plane.

The control-plane double records every stream that opens ("accepted") and ends
("closed"): an agent restarting is a node down from its "closed" to its next
"accepted". That timeline is the ground truth these tests read, not the
package's own coordination files.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from lab.doubles.llmgw import build_llmgw
from lab.release_server import publish_release
from tests.conftest import NEXT_RELEASE, RELEASE, ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

BINARY = "/usr/local/bin/llmgw"
BROKEN = "v3.0.0"
"""A release whose agent exits 1 at once (published by the test that needs it)."""


def timeline(cluster: Any, nodes: list[str], since: float) -> list[tuple[float, str, str]]:
    """(time, node, "closed"|"accepted") of these nodes' streams since ``since``, in order."""
    return sorted((e.time, e.node_id, e.outcome) for e in cluster.control_plane.events
                  if e.time >= since and e.node_id in nodes and e.outcome in ("closed", "accepted"))


def most_down_at_once(events: list[tuple[float, str, str]]) -> int:
    down: set[str] = set()
    most = 0
    for _, node, outcome in events:
        if outcome == "closed":
            down.add(node)
        else:
            down.discard(node)
        most = max(most, len(down))
    return most


def agent_steps(run_events: list[tuple[float, dict[str, Any]]], op: str) -> dict[str, tuple[float, float]]:
    """node -> (start, end) of its AgentInstall step ``op``, timed as the engine's event log reported them."""
    start: dict[str, float] = {}
    steps: dict[str, tuple[float, float]] = {}
    for t, event in run_events:
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            if kind not in event:
                continue
            meta = event[kind]["metadata"]
            if meta.get("op") != op or not meta.get("urn", "").split("::")[-2].endswith("AgentInstall"):
                continue
            node = meta["urn"].split("::")[-1]
            if kind == "resourcePreEvent":
                start[node] = t
            else:
                steps[node] = (start[node], t)
    return steps


def install_begins(run_events: list[tuple[float, dict[str, Any]]]) -> dict[str, float]:
    """node -> when its agent's install began on the node: AgentInstall says where the node fetches the release
    once the node's turn has come (inside its rollout gate, after any wait), as a debug diagnostic under the
    resource (in the event log; the CLI prints it only with `--debug`)."""
    begins: dict[str, float] = {}
    for t, event in run_events:
        diag = event.get("diagnosticEvent") or {}
        if "AgentInstall::" in diag.get("urn", "") and "the node fetches llmgw" in diag.get("message", ""):
            begins.setdefault(diag["urn"].split("::")[-1], t)
    return begins


def timed_up(stack: Any) -> tuple[Any, list[tuple[float, dict[str, Any]]]]:
    """`pulumi up`, and each engine event with the time it appeared (the control plane's clock)."""
    seen: list[tuple[float, dict[str, Any]]] = []
    run = stack.up(on_event=lambda e: seen.append((time.time(), e)))
    return run, seen


def versions(hosts: list[Any]) -> dict[str, bytes | None]:
    return {h.hostname: h.read_file(BINARY) for h in hosts}


def fleet_versions(lines: dict[str, str]) -> dict[str, str]:
    """node -> the agent version its line of the stack output `fleet` shows."""
    return {node: line.split(" agent ")[1].split()[0] for node, line in lines.items()}


def main_pid(host: Any, cluster: Any) -> str:
    return ssh(host, cluster, "systemctl show -p MainPID --value llmgw-agent")[1].strip()


def test_onboarding_is_not_gated_and_a_version_bump_restarts_two_at_a_time_canary_first(cluster, hosts, new_stack):
    fleet = hosts(6)
    ids = [h.hostname for h in fleet]
    canary = ids[0]
    config = stack_config(cluster, fleet, rollout={"maxParallel": 2, "canary": [canary]})
    stack = new_stack(config)

    # First-time onboarding with the rollout set: the creates run side by side, none waits for the canary.
    up, seen = timed_up(stack)
    assert up.ok, up.output
    creates, begins = agent_steps(seen, "create"), install_begins(seen)
    assert set(creates) == set(begins) == set(ids), (creates, begins)
    early = [n for n in ids if n != canary and begins[n] < creates[canary][1]]
    assert early, f"every other node's install began after the canary's agent was installed: {begins} {creates}"
    assert cluster.control_plane.wait_for(ids, timeout=20)

    # A version bump: canary first, then never more than 2 agents down at once.
    stack.set_config({**config, "agent": {"version": NEXT_RELEASE, "releaseUrl": cluster.release_url,
                                          "signingKey": cluster.release_signing_key}})
    t0 = time.time()
    up = stack.up()
    assert up.ok, up.output
    assert cluster.control_plane.wait_for(ids, timeout=20)
    events = timeline(cluster, ids, t0)
    print("\ntimeline:", *(f"{t - t0:6.2f}s {n} {o}" for t, n, o in events), sep="\n  ")
    assert {n for _, n, o in events if o == "closed"} == set(ids), "not every agent was restarted"
    assert most_down_at_once(events) <= 2, events
    canary_back = max(t for t, n, o in events if n == canary and o == "accepted")
    first_other_down = min(t for t, n, o in events if n != canary and o == "closed")
    assert canary_back < first_other_down, "a node went down before the canary was back"
    assert versions(fleet) == dict.fromkeys(ids, build_llmgw(NEXT_RELEASE))
    outputs = stack.outputs()
    assert {n: outputs[n]["agent_version"] for n in ids} == dict.fromkeys(ids, NEXT_RELEASE)
    assert fleet_versions(outputs["fleet"]) == dict.fromkeys(ids, NEXT_RELEASE), outputs["fleet"]

    # Another canary named (as each day's upgrade does): no agent restarts, and only the two nodes whose role
    # changed have new inputs; the other nodes' state is as it was.
    def agent_inputs() -> dict[str, Any]:
        return {r["urn"].split("::")[-1]: r["inputs"] for r in stack.export()["resources"]
                if r["type"].endswith("AgentInstall")}

    before = agent_inputs()
    stack.set_config({**config, "rollout": {"maxParallel": 2, "canary": [ids[1]]},
                      "agent": {"version": NEXT_RELEASE, "releaseUrl": cluster.release_url, "signingKey": cluster.release_signing_key}})
    t1 = time.time()
    up = stack.up()
    assert up.ok, up.output
    assert set(up.changes) == {"same"}, up.changes
    after = agent_inputs()
    assert {n for n in ids if after[n] != before[n]} == {canary, ids[1]}, (before, after)
    assert (after[canary]["rollout"]["canary"], after[ids[1]]["rollout"]["canary"]) == (False, True)
    assert "canaries" not in after[ids[2]]["rollout"], after[ids[2]]
    assert timeline(cluster, ids, t1) == [], "an agent restarted for a change of canaries"


@pytest.fixture(scope="module")
def broken_release(cluster: Any) -> str:
    """A release whose amd64 agent exits 1 at once."""
    if not (cluster.release_root / BROKEN).exists():
        # It reports its tag (a release must, before it is installed), then fails as an agent.
        script = f"#!/bin/sh\n[ \"$1\" != --version ] || {{ echo 'llmgw version {BROKEN}'; exit 0; }}\n" \
                 "echo 'llmgw: fatal: broken release' >&2\nexit 1\n"
        publish_release(cluster.release_root, BROKEN, {"amd64": script.encode()}, sign_with=cluster.release_signing_key_path)
    return BROKEN


def test_a_release_that_fails_to_start_stops_after_the_canary(cluster, hosts, new_stack, broken_release):
    fleet = hosts(3)
    ids = [h.hostname for h in fleet]
    canary, others = ids[1], [h for h in fleet if h.hostname != ids[1]]
    config = stack_config(cluster, fleet, rollout={"maxParallel": 2, "canary": [canary]})
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output
    assert cluster.control_plane.wait_for(ids, timeout=20)
    pids = {h.hostname: main_pid(h, cluster) for h in others}

    stack.set_config({**config, "agent": {"version": broken_release, "releaseUrl": cluster.release_url,
                                          "signingKey": cluster.release_signing_key}})
    t0 = time.time()
    up = stack.up()
    assert not up.ok
    assert f"{canary}: the agent did not stay running" in up.output, up.output
    for h in others:
        refusal = f"{h.hostname}: not updated: the rollout stopped because the update of {canary} failed"
        assert refusal in up.output, up.output
    assert "fix the release or config that failed" in up.output and "run `pulumi up` again" in up.output

    # The canary was rolled back; no other node started its update: same agent process, never disconnected.
    assert versions(fleet) == dict.fromkeys(ids, build_llmgw(RELEASE))
    assert {h.hostname: main_pid(h, cluster) for h in others} == pids
    assert cluster.control_plane.wait_for(ids, timeout=20)
    closed = {n for _, n, o in timeline(cluster, ids, t0) if o == "closed"}
    assert closed == {canary}, closed
    # The record says what runs: each AgentInstall still has the old version.
    agents = {r["urn"].split("::")[-1]: r["outputs"]["version"] for r in stack.export()["resources"]
              if r["type"].endswith("AgentInstall")}
    assert agents == dict.fromkeys(ids, RELEASE)
    table = stack.outputs()["fleet"]
    assert fleet_versions(table) == dict.fromkeys(ids, RELEASE), table
