"""Reviewing a fleet change (issue 20) under the real CLI, on real hosts: the summary of real previews checked
against what the following `up` did (restarts the control plane saw, serials, files), the policy pack failing,
warning and passing previews, the CI example's own commands (examples/ci/*.sh) run as the workflow runs them, and
what a node prints shown as text in the summary, read with a CommonMark parser (issue 36)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from typing import Any

import pytest

from llmgw_pulumi.preview import cli as review
from tests.conftest import NEXT_RELEASE, RELEASE, REPO, ssh, stack_config
from tests.unit.inert_markdown import MARKER, PARSER, assert_marker_only_in_code, kinds, leaves

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

CI = REPO / "examples" / "ci"
PACK = REPO / "llmgw_pulumi" / "policy"


def venv_active(stack: Any) -> None:
    """The project's venv first on PATH, as the workflow leaves it: the policy pack runs in its python3."""
    stack.env["PATH"] = f"{REPO / '.venv' / 'bin'}:{stack.env['PATH']}"


def ci(stack: Any, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of examples/ci's scripts, in the stack's project directory, as the workflow runs it."""
    return subprocess.run([str(CI / script), *args], cwd=stack.work_dir, env=stack.env, capture_output=True, text=True)


def policy_config(stack: Any, rules: dict[str, Any]) -> str:
    """The base branch's policy config, as the workflow checks it out beside the pull request's: its path."""
    path = stack.work_dir / "base" / f"policy.{stack.name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(rules))
    return str(path)


def policy_preview(stack: Any, rules: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`pulumi preview --policy-pack` with this policy config, as an operator types it."""
    config = stack.work_dir / "policy.json"
    config.write_text(json.dumps(rules))
    return stack.cli("preview", "--stack", stack.name, "--policy-pack", str(PACK), "--policy-pack-config", str(config),
                     check=False)


def closed_since(cluster: Any, nodes: list[str], since: float) -> list[str]:
    """The nodes whose agent stream closed since ``since`` (an agent restarting), in the order the control plane saw."""
    seen: list[str] = []
    for e in sorted(cluster.control_plane.events, key=lambda e: e.time):
        if e.time >= since and e.node_id in nodes and e.outcome == "closed" and e.node_id not in seen:
            seen.append(e.node_id)
    return seen


def serials(stack: Any) -> dict[str, str]:
    return {r["urn"].split("::")[-1]: r["outputs"]["serial"] for r in stack.export()["resources"]
            if r["type"].endswith("ClientCertificate")}


def host_keys(stack: Any) -> dict[str, str]:
    return {r["urn"].split("::")[-1]: r["outputs"]["host_key"] for r in stack.export()["resources"]
            if r["type"].endswith("NodeIdentity")}


def expand(ids: str) -> list[str]:
    """The node ids a summary line names, its ranges (gpu-01..03) expanded; a folded list counts once, in full."""
    if "<details>" in ids:
        ids = ids.split("</summary>", 1)[1]
    out: list[str] = []
    for token in re.findall(r"`([^`]+)`", ids):
        m = re.fullmatch(r"(.*?)(\d+)\.\.(\d+)", token)
        if m:
            width = len(m.group(2))
            out += [f"{m.group(1)}{n:0{width}d}" for n in range(int(m.group(2)), int(m.group(3)) + 1)]
        else:
            out.append(token)
    return out


def row(summary: str, what: str) -> list[str]:
    """The ids of one row of the summary's table (``| what | n | ids |``); [] when the row is absent."""
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] == what:
            ids = expand(cells[2])
            assert int(cells[1]) == len(ids), line
            return ids
    return []


def test_the_summary_of_a_real_preview_says_what_the_up_then_does(cluster, hosts, new_stack):
    fleet = hosts(8)
    up_, cfg, key, drift, gone, idle, down, new = fleet
    ids = [h.hostname for h in fleet]
    nodes = [{"id": h.hostname, "address": h.addr} for h in fleet[:-1]]
    nodes[ids.index(idle.hostname)]["engines"] = {"vllm": {"bin": "/opt/none/bin/vllm"}}
    config = stack_config(cluster, fleet, nodes=nodes, ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path),
                                                             "wait": 10},
                          agent={"version": RELEASE, "releaseUrl": cluster.release_url,
                                 "signingKey": cluster.release_signing_key},
                          rollout={"maxParallel": 1, "canary": [up_.hostname]})
    stack = new_stack(config)
    venv_active(stack)
    first = ci(stack, "up.sh", stack.name)  # the merge job's command, with the policy pack
    assert first.returncode == 0, first.stdout + first.stderr
    assert "host-keys-pinned" in first.stdout and "advisory" in first.stdout, first.stdout  # a warning, not a failure
    assert cluster.control_plane.wait_for(ids[:-1], timeout=30)

    # One change of every kind at once, and what a refresh finds on the nodes.
    changed = [dict(n) for n in nodes if n["id"] != gone.hostname] + [{"id": new.hostname, "address": new.addr}]
    changed[ids.index(up_.hostname)]["agent"] = {"version": NEXT_RELEASE}
    changed[ids.index(cfg.hostname)]["mgmtAddr"] = "10.1.0.9"
    assert ssh(key, cluster, "sudo rm /etc/llmgw/agent-key.pem")[0] == 0
    assert ssh(drift, cluster, "echo 'log_level: debug' | sudo tee -a /etc/llmgw/agent.yaml")[0] == 0
    down.stop()
    stack.set_config({**config, "nodes": changed})
    rules = policy_config(stack, {"removal-allowed": {"allowed": [gone.hostname]}})
    before = serials(stack)

    # The scheduled refresh records what the nodes hold; the pull request's preview then reaches no node.
    refreshed = ci(stack, "refresh.sh", stack.name)
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    assert down.hostname in refreshed.stdout and "its state is kept as it was" in refreshed.stdout, refreshed.stdout
    previewed = ci(stack, "preview.sh", stack.name, "out", rules)  # the pull request job's command
    assert previewed.returncode == 0, previewed.stdout + previewed.stderr
    summary = (stack.work_dir / "out" / "summary.md").read_text()
    print("\n" + summary)
    assert row(summary, f"onboarded: agent `{RELEASE}`, no fabric, host key trusted on first use") == [new.hostname]
    assert row(summary, f"agent upgraded `{RELEASE}` → `{NEXT_RELEASE}`") == [up_.hostname]
    assert row(summary, "config changed") == [cfg.hostname]
    assert "+ mgmt_addr: 10.1.0.9" in summary
    assert row(summary, "certificate re-issued (key lost)") == [key.hostname]
    assert row(summary, "files repaired after drift") == sorted([key.hostname, drift.hostname], key=review.natural)
    assert row(summary, "removed") == [gone.hostname]
    assert row(summary, "untouched") == sorted([idle.hostname, down.hostname], key=review.natural)
    fleet_review = review.review(json.loads((stack.work_dir / "out" / "preview.json").read_text()))
    canaries, then, outside, max_parallel = fleet_review.restart_order()
    assert (canaries, max_parallel) == ([up_.hostname], 1)
    assert then == sorted([cfg.hostname, drift.hostname], key=review.natural) and outside == [key.hostname]
    assert f"the canaries, in any order: `{up_.hostname}`" in summary and f"**without a rollout** (1): `{key.hostname}`" in summary
    assert "**Policies: no mandatory rule is violated**" in summary  # the pack ran; host keys unpinned: advisory
    advisory = summary.split("Advisory rules violated:\n")[1].splitlines()
    pinned = next(line for line in advisory if line.startswith("- `host-keys-pinned` ("))  # one line for the rule
    assert new.hostname in expand(pinned.split(" — on ")[1]), pinned
    problems = summary.split("**Standing problems:**")[1].split("**Policies")[0]
    assert f"engines and hardware (1 nodes): `{idle.hostname}`" in problems and "/opt/none/bin/vllm" in problems

    t0 = time.time()
    applied = ci(stack, "up.sh", stack.name, rules)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    live = [h.hostname for h in fleet if h not in (gone, down)]
    assert cluster.control_plane.wait_for(live, timeout=30)
    time.sleep(2)  # the last restarted agents' reconnections are in; a restart the summary missed would show here
    restarted = closed_since(cluster, [h.hostname for h in fleet], t0)
    assert set(restarted) == {up_.hostname, cfg.hostname, drift.hostname, key.hostname, gone.hostname}, restarted
    assert restarted.index(up_.hostname) < min(restarted.index(cfg.hostname), restarted.index(drift.hostname))
    after = serials(stack)
    assert {n for n in before if n in after and before[n] != after[n]} == {key.hostname}
    assert new.hostname in after
    assert up_.read_file("/usr/local/bin/llmgw") == cluster_binary(NEXT_RELEASE)
    assert b"log_level: debug" not in (drift.read_file("/etc/llmgw/agent.yaml") or b"")
    assert b"mgmt_addr: 10.1.0.9" in (cfg.read_file("/etc/llmgw/agent.yaml") or b"")
    assert key.read_file("/etc/llmgw/agent-key.pem") is not None
    assert gone.read_file("/etc/llmgw/agent.pem") is None


def cluster_binary(version: str) -> bytes:
    from lab.doubles.llmgw import build_llmgw
    return build_llmgw(version)


def test_every_policy_rule_fails_a_preview_warns_when_advisory_and_passes_a_compliant_one(cluster, hosts, new_stack,
                                                                                           tmp_path):
    fleet = hosts(3)
    a, b, c = (h.hostname for h in fleet)
    config = stack_config(cluster, fleet)
    stack = new_stack(config)
    venv_active(stack)
    up = stack.up()
    assert up.ok, up.output
    pins = host_keys(stack)
    bump = {"version": NEXT_RELEASE, "releaseUrl": cluster.release_url}

    # Violating: no pins, an operator-made key, long certificates, an unsigned release (the program takes it only
    # under the opt-out), two agents restarting without a rollout, a node removed that nobody allowed.
    stack.set_config({**config, "agent": {**bump, "allowUnverifiedRelease": True}, "certificate": {"validityHours": 8760},
                      "nodes": [{"id": a, "address": fleet[0].addr, "keyOrigin": "operator"},
                                {"id": b, "address": fleet[1].addr}]})
    messages = {
        "host-keys-pinned": f"{a}: its SSH host key is not pinned",
        "no-operator-keys": f"{a}: keyOrigin: operator makes its private key here",
        "certificate-validity": f"{b}: its certificate would be valid for 8760 hours, more than the 720",
        "release-verified": f"{b}: release {NEXT_RELEASE} is installed from a checksums.txt nobody signed",
        "rollout-required": "2 running agents would restart at once",
        "removal-allowed": f"{c}: this change removes the node",
        # Dropping the signing key for the opt-out is a change of a trust root.
        "trust-roots-unchanged": f"{b}: agent.signingKey changes from SHA256:",
    }
    strict = {name: {"enforcementLevel": "mandatory"} for name in messages}
    strict["certificate-validity"]["maxHours"] = 720
    failed = policy_preview(stack, strict)
    out = failed.stdout + failed.stderr
    print(out)
    assert failed.returncode != 0, out
    for name, message in messages.items():
        assert re.search(rf"\[mandatory\]\s+{name}\s", out), (name, out)
        assert message in out, (name, out)

    advisory = {name: {**level, "enforcementLevel": "advisory"} for name, level in strict.items()}
    warned = policy_preview(stack, advisory)
    out = warned.stdout + warned.stderr
    assert warned.returncode == 0, out
    for name, message in messages.items():
        assert re.search(rf"\[advisory\]\s+{name}\s", out) and message in out, (name, out)

    # Compliant: pinned, keys made on the nodes, short enough, signed, the same bump under a rollout, the removal
    # allowed.
    stack.set_config({**config, "agent": {**bump, "signingKey": cluster.release_signing_key},
                      "certificate": {"validityHours": 720, "renewBeforeHours": 72}, "rollout": {"maxParallel": 1, "canary": [a]},
                      "nodes": [{"id": a, "address": fleet[0].addr, "hostKey": pins[a]},
                                {"id": b, "address": fleet[1].addr, "hostKey": pins[b]}]})
    # Pinning the host keys is a change of trust roots too: the base branch's policy config approves each pin.
    approved = [{"setting": "hostKey", "to": fingerprint(pins[n], tmp_path)} for n in (a, b)]
    allowed = {**strict, "removal-allowed": {"enforcementLevel": "mandatory", "allowed": [c]},
               "trust-roots-unchanged": {"enforcementLevel": "mandatory", "allowed": approved}}
    passed = policy_preview(stack, allowed)
    out = passed.stdout + passed.stderr
    assert passed.returncode == 0, out
    assert "✅ llmgw-fleet@v0.1.0" in out, out  # the pack ran: a positive control for the line below
    assert not re.search(r"\[(mandatory|advisory)\]", out), out


def most_down_at_once(cluster: Any, nodes: list[str], since: float) -> int:
    down: set[str] = set()
    most = 0
    for e in sorted(cluster.control_plane.events, key=lambda e: e.time):
        if e.time < since or e.node_id not in nodes or e.outcome not in ("closed", "accepted"):
            continue
        (down.add if e.outcome == "closed" else down.discard)(e.node_id)
        most = max(most, len(down))
    return most


def summary_line(summary: str, label: str) -> list[str]:
    """The ids the summary's line starting with ``label`` names, with its folded list (the lines down to
    ``</details>``) when it has one."""
    lines = summary.splitlines()
    at = next((i for i, x in enumerate(lines) if x.strip().startswith(label)), None)
    if at is None:
        return []
    text = lines[at]
    if "<details>" in text:
        end = next(i for i in range(at, len(lines)) if "</details>" in lines[i])
        text = "\n".join(lines[at:end + 1])
    return expand(text)


def test_on_7_nodes_the_summary_of_a_bump_under_rollout_names_the_restarts_in_the_order_they_happen(
        cluster, hosts, new_stack):
    # 7 nodes: two canaries (not in name order), one held back, and four more, which restart in two full batches
    # of maxParallel (a rollout that ignored it would exceed it). How the summary folds long lists is the unit
    # tests' (tests/unit/test_review.py, on 1,000 nodes); what only real hosts show is the order of the restarts.
    fleet = hosts(7)
    ids = [h.hostname for h in fleet]
    canaries, kept = [ids[4], ids[1]], ids[-1:]
    config = stack_config(cluster, fleet, agent={"version": RELEASE, "releaseUrl": cluster.release_url,
                                                 "signingKey": cluster.release_signing_key},
                          rollout={"maxParallel": 2, "canary": canaries})
    stack = new_stack(config)
    venv_active(stack)
    up = stack.up()
    assert up.ok, up.output
    assert cluster.control_plane.wait_for(ids, timeout=60)

    # Every node but one (held back on the old release) gets the new one.
    nodes = [{"id": h.hostname, "address": h.addr, **({"agent": {"version": RELEASE}} if h.hostname in kept else {})}
             for h in fleet]
    stack.set_config({**config, "agent": {**config["agent"], "version": NEXT_RELEASE}, "nodes": nodes})
    previewed = ci(stack, "preview.sh", stack.name, "out")
    assert previewed.returncode == 0, previewed.stdout + previewed.stderr
    summary = (stack.work_dir / "out" / "summary.md").read_text()
    print("\n" + summary)
    bumped = [n for n in ids if n not in kept]
    others = sorted((n for n in bumped if n not in canaries), key=review.natural)
    assert row(summary, f"agent upgraded `{RELEASE}` → `{NEXT_RELEASE}`") == sorted(bumped, key=review.natural)
    assert row(summary, "untouched") == sorted(kept, key=review.natural)
    assert len(others) == 2 * config["rollout"]["maxParallel"]
    assert "**Agents that will restart: 6**" in summary and "(at most 2 at once)" in summary
    assert sorted(summary_line(summary, "1. the canaries, in any order:")) == sorted(canaries)
    assert summary_line(summary, "2. then, in any order:") == others
    assert "without a rollout" not in summary

    t0 = time.time()
    applied = ci(stack, "up.sh", stack.name)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cluster.control_plane.wait_for(ids, timeout=60)
    time.sleep(2)  # a restart the summary did not name would show up here
    restarted = closed_since(cluster, ids, t0)
    print("restarts as the control plane saw them:", restarted)
    # Exactly the nodes named, in the summary's order: the canaries first (between them in any order),
    # each back before any other went down, then the rest, never more than maxParallel down at once.
    assert sorted(restarted[:2], key=canaries.index) == canaries and sorted(restarted[2:], key=review.natural) == others
    events = [e for e in cluster.control_plane.events if e.time >= t0]
    canaries_back = max(e.time for e in events if e.node_id in canaries and e.outcome == "accepted")
    first_other_down = min(e.time for e in events if e.node_id in others and e.outcome == "closed")
    assert canaries_back < first_other_down
    assert most_down_at_once(cluster, ids, t0) <= 2
    assert {h.hostname for h in fleet if h.read_file("/usr/local/bin/llmgw") == cluster_binary(NEXT_RELEASE)} == set(bumped)


MARKDOWN_ENGINE = "/opt/llama/llama-server"
MARKDOWN_SHOUT = ("printf '%s\\n' 'starting' '### pwn [a](https://evil.example/pwn) ![x](x.png) </details><img src=x> "
                  "<https://evil.example> @pwn-team #1 **Policies: no mandatory rule is violated** `` ` `` |---| <!--' "
                  ">&2; exit 3")
"""What the engine prints before it fails; its last line (the one the probe reports) holds a heading, a link, an
image, raw HTML, an autolink, a mention, a reference, a forged verdict, backticks, a table break and an unclosed
comment."""


def test_an_engine_that_prints_markdown_and_html_is_shown_as_text_in_the_summary(cluster, hosts, new_stack):
    (h,) = hosts(1)
    printed = subprocess.run(["sh", "-c", MARKDOWN_SHOUT], capture_output=True, text=True).stderr.splitlines()[-1]
    assert {"heading_open", "link_open", "image", "html_inline"} <= kinds(printed)  # live Markdown, as it is
    script = f"#!/bin/sh\n{MARKDOWN_SHOUT}\n"
    rc, out = ssh(h, cluster, f"sudo mkdir -p /opt/llama && printf '%s' {shlex.quote(script)} | "
                              f"sudo tee {MARKDOWN_ENGINE} >/dev/null && sudo chmod 0755 {MARKDOWN_ENGINE}")
    assert rc == 0, out
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr,
                                                 "engines": {"llamacpp": {"bin": MARKDOWN_ENGINE}}}])
    stack = new_stack(config)
    venv_active(stack)
    up = stack.up()
    assert up.ok, up.output
    problems = stack.outputs()[h.hostname]["problems"]
    assert any("[a](https://evil.example/pwn)" in str(p) for p in problems), problems  # the node said it

    previewed = ci(stack, "preview.sh", stack.name, "out")  # the pull request job's command, policy pack and all
    summary = (stack.work_dir / "out" / "summary.md").read_text()
    print("\n" + summary)
    assert summary.startswith(f"### Fleet change — `{stack.name}`: 1 nodes"), previewed.stdout + previewed.stderr
    assert "\n**Policies: " in summary  # the policy pack's verdict, read from its run
    problem = next(line for line in summary.splitlines() if line.startswith(f"  - `{h.hostname}`: ") and MARKER in line)
    assert "### pwn [a](https://evil.example/pwn)" in problem and "|---| <!--" in problem, problem
    assert_marker_only_in_code(summary)
    spans = [t.content for t in leaves(PARSER.parse(summary)) if t.type == "code_inline" and MARKER in t.content]
    assert any("</details><img src=x>" in s and "@pwn-team" in s for s in spans), spans


def fingerprint(public_key: str, tmp: Any) -> str:
    """``SHA256:...`` of an OpenSSH public key, as ssh-keygen prints it."""
    path = tmp / "key.pub"
    path.write_text(public_key + "\n")
    return subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_a_pull_request_that_changes_a_trust_root_shows_its_row_and_fails_unless_the_base_allows_it(
        cluster, hosts, new_stack, tmp_path):
    fleet = hosts(2)
    ids = sorted((h.hostname for h in fleet), key=review.natural)
    config = stack_config(cluster, fleet, agent={"version": RELEASE, "releaseUrl": cluster.release_url,
                                                 "signingKey": cluster.release_signing_key})
    stack = new_stack(config)
    venv_active(stack)
    up = stack.up()
    assert up.ok, up.output
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(tmp_path / "other")], check=True)
    other_key = (tmp_path / "other.pub").read_text().strip()
    signer_program = "/usr/bin/true"
    # One pull request changes two trust roots: it points the signer at another program (the same CA certificate)
    # and swaps the release signing key. Each has its own row, and approving one does not approve the other.
    changed = {**config, "signer": {"kind": "command", "ca": str(cluster.pki_dir / "ca.pem"), "command": [signer_program]},
               "agent": {**config["agent"], "signingKey": other_key}}
    rows = {"signer": [("signer.kind", "pkiDir", "command"), ("signer.command", "none", signer_program)],
            "signing key": [("agent.signingKey", fingerprint(cluster.release_signing_key, tmp_path),
                             fingerprint(other_key, tmp_path))]}
    every_row = [r for kind in rows.values() for r in kind]
    stack.set_config(changed)
    out = "out"
    refused = ci(stack, "preview.sh", stack.name, out, policy_config(stack, {}))  # the base allows nothing
    summary = (stack.work_dir / out / "summary.md").read_text()
    print("\n" + summary)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    for setting, old, new in every_row:
        assert row(summary, f"trust root `{setting}` changed: `{old}` → `{new}`") == ids, (setting, summary)
    assert row(summary, "untouched") == ids  # nothing on the nodes changes
    assert "**Policies: a mandatory rule is violated**" in summary
    violated = summary.split("Mandatory rules violated:\n")[1].splitlines()
    (line,) = [v for v in violated if v.startswith("- `trust-roots-unchanged` (")]
    assert expand(line.split(" — on ")[1].split(":", 1)[1]) == ids, line
    assert_marker_only_in_code(summary.replace(ids[0], f"{ids[0]} {MARKER}", 1))  # no link, HTML or mention
    # The merge job's `up` is judged by the same rule, before anything changes.
    merged = ci(stack, "up.sh", stack.name, policy_config(stack, {}))
    assert merged.returncode != 0 and "trust-roots-unchanged" in merged.stdout, merged.stdout + merged.stderr
    assert not [r for r in stack.export()["resources"]
                if r["type"].endswith("ClientCertificate") and r["inputs"].get("signer")]

    def allow(*kinds: str) -> list[dict[str, str]]:
        return [{"setting": setting, "to": new} for kind in kinds for setting, _, new in rows[kind]]

    # Approving one change, or another value than the one made, does not approve the other (the pack's verdict).
    wrong_key = [{**a, "to": fingerprint(cluster.release_signing_key, tmp_path)} for a in allow("signing key")]
    for partly in (allow("signing key"), allow("signer") + wrong_key):
        verdict = policy_preview(stack, {"trust-roots-unchanged": {"allowed": partly}})
        assert verdict.returncode != 0 and "trust-roots-unchanged" in verdict.stdout + verdict.stderr, partly
    base = policy_config(stack, {"trust-roots-unchanged": {"allowed": allow("signer", "signing key")}})
    passed = ci(stack, "preview.sh", stack.name, out, base)
    summary = (stack.work_dir / out / "summary.md").read_text()
    assert passed.returncode == 0, passed.stdout + passed.stderr + summary
    assert "**Policies: no mandatory rule is violated**" in summary and "trust-roots-unchanged" not in summary
    for setting, old, new in every_row:  # still shown: approved is not hidden
        assert row(summary, f"trust root `{setting}` changed: `{old}` → `{new}`") == ids, (setting, summary)
    stack.set_config(config)
