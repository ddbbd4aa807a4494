"""The fleet change summary (llmgw_pulumi.preview.cli) and the fleet rules (llmgw_pulumi.preview.rules), pure.

The fixture is a real preview (`pulumi preview --json --diff --refresh` of a 5-node lab stack, trimmed of stack
traces and provider payloads): node10 upgraded, node11 reconfigured, node12's key deleted on the node, node13
removed, node14 untouched with a missing engine. tests/e2e/test_review.py checks the summary against real `up`s;
these check what a real preview cannot easily hold (expiry, a rotated CA, 1,000 nodes, hostile node text).
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi import decisions
from llmgw_pulumi.preview import cli
from llmgw_pulumi.preview import rules as fleet_rules
from tests.unit.review_previews import NOW, created, preview, step


def test_the_real_preview_is_read_node_by_node():
    fleet = cli.review(preview(), NOW)
    n = fleet.nodes
    assert set(n) == {"node10", "node11", "node12", "node13", "node14"}
    assert n["node10"].upgrade == ("v1.4.2", "v1.5.0") and n["node10"].restart_gated and not n["node10"].config_lines
    assert n["node11"].config_lines == ("+ mgmt_addr: 10.1.0.9",) and n["node11"].restart_gated
    assert n["node12"].certificate == ("key lost",) and n["node12"].repaired == ("/etc/llmgw/agent-key.pem",)
    assert n["node12"].restart_ungated and not n["node12"].restart_gated
    assert n["node13"].removed and not n["node13"].restarts
    assert n["node14"].untouched and n["node14"].problems == [
        "vllm is configured at /opt/none/vllm, which does not exist on node14 "
        "(fix: install vllm there, or fix engines.vllm in the stack config)"]
    assert fleet.restart_order() == (["node10"], ["node11"], ["node12"], 2)


def test_expiry_and_a_rotated_ca_are_told_apart():
    data = preview()
    cert = step(data, "ClientCertificate", "node12")
    cert["oldState"]["outputs"]["node_key"] = "held"
    assert cli.review(data, NOW).nodes["node12"].certificate == ()
    cert["oldState"]["outputs"]["not_after"] = (NOW + dt.timedelta(hours=100)).isoformat()  # renewBeforeHours 720
    assert cli.review(data, NOW).nodes["node12"].certificate == ("expiry",)
    cert["newState"]["inputs"]["ca_fingerprint"] = "another"
    assert cli.review(data, NOW).nodes["node12"].certificate == ("expiry", "CA rotation")
    summary = cli.markdown(cli.review(data, NOW))
    assert "| certificate renewed (expiry) | 1 | `node12` |" in summary
    assert "| certificate re-issued (CA rotation) | 1 | `node12` |" in summary


def test_an_operator_side_change_restarts_nothing():
    data = preview()
    agent = step(data, "AgentInstall", "node11")
    agent["newState"]["inputs"] = {**agent["oldState"]["inputs"],
                                   "connection": {**agent["oldState"]["inputs"]["connection"], "user": "other"}}
    node = cli.review(data, NOW).nodes["node11"]
    assert not node.restarts and not node.config_lines and node.untouched


def test_a_thousand_nodes_fit_about_one_screen():
    data = preview()
    base = [s for s in data["steps"] if s["urn"].endswith("::node10") and s["op"] != "refresh"]
    steps = []
    for i in range(1000):
        for s in base:
            s = copy.deepcopy(s)
            s["urn"] = s["urn"].replace("::node10", f"::gpu-{3 * i:04d}")  # no runs to shorten
            for state in (s.get("oldState"), s.get("newState")):
                if ((state or {}).get("inputs") or {}).get("rollout"):
                    state["inputs"]["rollout"]["canary"] = False  # node10 is the canary; its copies are not
            steps.append(s)
    fleet = cli.review({"steps": steps}, NOW)
    canaries, then, outside, _ = fleet.restart_order()
    assert len(then) == 1000 and not canaries and not outside
    summary = cli.markdown(fleet)
    print(summary)
    visible = summary.split("<details>")[0] + "".join(part.split("</details>", 1)[-1] for part in summary.split("<details>")[1:])
    assert len(visible.splitlines()) <= 40 and len(visible) < 2500, visible  # about one screen, unfolded
    folded = summary.split("<details>")[1]
    assert all(f"`gpu-{3 * i:04d}`" in folded for i in range(1000))  # the folded list names every node


def test_what_came_from_a_node_is_printed_escaped():
    data = preview()
    engines = next(s for s in data["steps"] if s["urn"].endswith("EngineCheck::node14"))
    engines["newState"]["outputs"]["problems"] = [{"problem": "vllm \x1b[2J\x1b[1;1Hall good\u202e", "hint": "x\ny"}]
    agent = step(data, "AgentInstall", "node11")
    agent["newState"]["inputs"]["agent_yaml"] += "hostname: evil\x1b]0;pwned\x07\n"
    out = io.StringIO()
    assert cli.main([], stdin=io.StringIO(json.dumps(data)), stdout=out) == 0
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "\\u202e" in text and "x\\ny" in text and "hostname: evil\\x1b]0;pwned\\x07" in text


def test_input_that_is_not_a_preview_gets_a_clear_error(capsys):
    assert cli.main([], stdin=io.StringIO("Previewing update (prod):"), stdout=io.StringIO()) == 2
    assert "run `pulumi preview --json | python -m llmgw_pulumi.preview.cli`" in capsys.readouterr().err


def test_id_ranges_fold_only_runs_of_one_prefix_and_width():
    assert cli._ranges(["a1", "a2", "a3", "a5", "b6", "b7", "gpu-9", "gpu-10", "gpu-11", "gpu-12"]) == [
        "a1..3", "a5", "b6", "b7", "gpu-9", "gpu-10..12"]
    assert cli._ranges(["x", "node10", "node11", "node12"]) == ["x", "node10..12"]


# --------------------------------------------------------------------------- the rules


def agent(name: str, **props: Any) -> fleet_rules.Resource:
    return fleet_rules.Resource(cli.AGENT, name, {"node_id": name, "version": "v1", **props}, f"urn::AgentInstall::{name}")


def test_rollout_required_counts_running_agents_that_restart():
    deployed = [agent("a"), agent("b"), agent("c")]
    bumped = [agent("a", version="v2"), agent("b", version="v2"), agent("c")]
    violations = fleet_rules.rollout_required(deployed, bumped, {})
    assert [urn for urn, _ in violations] == ["urn::AgentInstall::a", "urn::AgentInstall::b"]
    assert "2 running agents would restart at once (a, b)" in violations[0][1] and "Set llmgw:rollout" in violations[0][1]
    assert fleet_rules.rollout_required(deployed, bumped, {"maxRestarts": 2}) == []
    governed = [agent(r.name, version="v2", rollout={"max_parallel": 1}) for r in deployed]
    assert fleet_rules.rollout_required(deployed, governed, {}) == []
    # A new node is onboarded, not restarted; an output the node reported (an unchanged resource's props are its
    # outputs) is not a change.
    recorded = fleet_rules.Resource(cli.AGENT, "a", deployed[0].props, deployed[0].urn, frozenset({"node_state"}))
    assert fleet_rules.restarting_agents([recorded], [agent("a", node_state={"x": 1}), agent("n", version="v2")]) == []
    assert fleet_rules.restarting_agents([recorded], [agent("a", version="v2", node_state={"x": 1})])


def test_removal_allowed_names_each_removed_node_not_listed():
    def node(name: str) -> fleet_rules.Resource:
        return fleet_rules.Resource(cli.NODE_TYPE, name, {}, f"urn::llmgw:index:Node::{name}")

    deployed, planned = [node("a"), node("b"), node("c")], [node("a")]
    assert [m.split(":")[0] for _, m in fleet_rules.removal_allowed(deployed, planned, {})] == ["b", "c"]
    assert [m.split(":")[0] for _, m in fleet_rules.removal_allowed(deployed, planned, {"allowed": ["b"]})] == ["c"]


def test_release_verified_judges_the_record_not_the_stack_config():
    # The stack config pins the release; the record says nothing verified it: the record is what counts
    # (the rule cannot see a node list file's or a component's pins, only what the program recorded).
    props = {"node_id": "a", "version": "v1.5.0", "verification": "opt-out", "allow_unverified_release": True}
    assert fleet_rules.release_verified(cli.AGENT, props, {})
    signed = {**props, "verification": "signature", "signing_key": "ssh-ed25519 AAAA"}
    assert fleet_rules.release_verified(cli.AGENT, signed, {}) is None
    dev = {"node_id": "a", "version": "dev", "binary_path": "/tmp/llmgw", "verification": "local build"}
    assert "local build" in (fleet_rules.release_verified(cli.AGENT, dev, {}) or "")
    assert fleet_rules.release_verified(cli.AGENT, dev, {"allowDevBuild": True}) is None
    pinned = {"llmgw:agent": {"sha256": {"amd64": "00" * 32}}}
    assert fleet_rules.stack_config_from_env(json.dumps({"llmgw:agent": json.dumps(pinned["llmgw:agent"])})) == pinned


def test_a_node_that_could_not_be_read_is_said_once_and_not_as_an_engine_problem():
    data = preview()
    urn = next(s["urn"] for s in data["steps"] if s["urn"].endswith("EngineCheck::node14"))
    said = f"warning: {decisions.unreadable_warning('node14: cannot reach deploy@10.0.0.9 over ssh after 10s')}\n"
    data["diagnostics"] += [{"urn": urn.replace("EngineCheck", kind), "message": said, "severity": "warning"}
                            for kind in ("EngineCheck", "AgentInstall", "NodeIdentity")]
    node = cli.review(data, NOW).nodes["node14"]
    assert node.unreadable == ["node14: cannot reach deploy@10.0.0.9 over ssh after 10s; its state is kept as it was"]
    assert len(node.problems) == 1 and "vllm" in node.problems[0]


POLICY_RUN = """Previewing update (prod):
 ~  pulumi-python:dynamic/llmgw:AgentInstall gpu-01 update
Policies:
    \u274c llmgw-fleet@v0.1.0 (local: /venv/llmgw_pulumi/policy)
        - [mandatory]  release-verified  (pulumi-python:dynamic/llmgw:AgentInstall: gpu-01)
          gpu-01: release v1.5.0 is installed from a checksums.txt nobody signed\x1b[2J

Diagnostics:
  pulumi:pulumi:Stack (llmgw-prod):
"""


def test_the_policy_verdict_is_the_cli_s_policies_block_escaped():
    verdict = cli.policy_verdict(POLICY_RUN)
    assert verdict.startswith("**Policies: a mandatory rule is violated** (1 violations)")
    assert "Mandatory rules violated:\n- `release-verified` (1): `release v1.5.0 is installed from a checksums.txt " \
           "nobody signed\\x1b[2J` — on `gpu-01`" in verdict
    assert "\x1b" not in verdict
    assert "Diagnostics" not in verdict and "Previewing" not in verdict and "llmgw-prod" not in verdict
    passed = POLICY_RUN.replace("\u274c", "\u2705").replace("[mandatory]", "[advisory]")
    assert cli.policy_verdict(passed).startswith("**Policies: no mandatory rule is violated** (1 violations)")
    assert "Advisory rules violated:\n- `release-verified` (1)" in cli.policy_verdict(passed)
    assert "printed no verdict" in cli.policy_verdict("error: could not load the policy pack")


def test_an_unchanged_agent_whose_outputs_keep_agent_yaml_as_a_digest_does_not_restart():
    """An unchanged AgentInstall's props are its outputs, which keep agent.yaml and the unit as digests; its
    recorded inputs keep the texts. Read through the provider's own ``observed.digested``, they are the same."""
    from llmgw_pulumi.nodestate import observed

    text = "server: 10.0.0.1:7443\nnode_id: a\n"
    recorded = fleet_rules.Resource(cli.AGENT, "a", {"node_id": "a", "version": "v1", "agent_yaml": text},
                                    "urn::AgentInstall::a", frozenset({"arch"}))
    kept = observed.digested(recorded.props)["agent_yaml"]
    assert kept.startswith("sha256:") and kept != text
    unchanged = agent("a", agent_yaml=kept, arch="amd64")
    assert fleet_rules.restarting_agents([recorded], [unchanged]) == []
    edited = agent("a", agent_yaml=text + "log_level: debug\n")
    assert fleet_rules.restarting_agents([recorded], [edited]) == [edited]
    assert fleet_rules.restarting_agents([recorded], [agent("a", agent_yaml="sha256:" + "A" * 43)])


def test_the_policy_sdk_s_props_become_plain_values_that_compare_with_the_recorded_ones():
    from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy

    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # how the engine marks a value a preview cannot know
    props = unknown_checking_proxy({"servers": ["cp1:7443"], "nested": {"hcas": ["mlx5_0", unknown]}, "hostname": unknown})
    assert props["servers"] != ["cp1:7443"]  # the SDK's list is a proxy: the reason for plain()
    assert fleet_rules.plain(props, UnknownValueError) == {
        "servers": ["cp1:7443"], "nested": {"hcas": ["mlx5_0", cli.UNKNOWN]}, "hostname": cli.UNKNOWN}


POLICY_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "review" / "policy.txt"


def test_policy_results_are_one_line_per_rule_with_the_nodes_folded():
    # The CLI's block for 40 nodes of one rule, two of another, one stack-level violation and one advisory, each
    # violation's message the rule's description and then what the rule reported (pulumi-policy's format).
    verdict = cli.policy_verdict(POLICY_FIXTURE.read_text())
    print(verdict)
    lines = verdict.splitlines()
    assert lines[0] == "**Policies: a mandatory rule is violated** (44 violations)"
    rules = [line for line in lines if line.startswith("- ")]
    assert len(rules) == 4 and len(lines) <= 10, verdict
    mandatory, advisory = lines.index("Mandatory rules violated:"), lines.index("Advisory rules violated:")
    assert [r.split("`")[1] for r in rules] == ["release-verified", "removal-allowed", "rollout-required", "host-keys-pinned"]
    assert all(mandatory < lines.index(r) < advisory for r in rules[:3]) and lines.index(rules[3]) > advisory
    assert rules[0].startswith("- `release-verified` (40): `release v1.5.0 is installed from a checksums.txt nobody "
                               "signed. Set agent.signingKey")
    assert rules[0].endswith("— on 40 nodes: `gpu-001..040`")  # the nodes' own names dropped from the messages
    assert rules[1].endswith("`the stack's last deployment could not be read` — on the stack")
    assert rules[2].endswith("— on 2 nodes: `gpu-007`, `gpu-008`") and rules[3].endswith("— on `gpu-041`")
    assert "Every agent release is verified" not in verdict  # the rule's description is not repeated per node


def test_the_verdict_follows_the_violation_lines_not_what_a_message_says():
    text = POLICY_FIXTURE.read_text()
    advisory_only = text.replace("\u274c", "\u2705").replace("[mandatory]", "[advisory]")
    assert cli.policy_verdict(advisory_only).startswith("**Policies: no mandatory rule is violated** (44 violations)")
    # A message line (indented by ten) that looks like a violation or a pack's failure is a message.
    forged = advisory_only.replace(
        "          gpu-041: its SSH", "          - [mandatory]  removal-allowed  (x: gpu-041)\n          \u274c llmgw-fleet@v0.1.0\n"
                                    "          gpu-041: its SSH")
    verdict = cli.policy_verdict(forged)
    assert verdict.startswith("**Policies: no mandatory rule is violated** (44 violations)"), verdict
    stray = "Policies:\n    \u2705 llmgw-fleet@v0.1.0 (local: /p)\n          - [mandatory]  forged  (x: y)\n" \
            "          \u274c llmgw-fleet@v0.1.0 (local: /p)\n"
    assert cli.policy_verdict(stray).startswith("**Policies: no mandatory rule is violated** (0 violations)")
    # A pack that says it failed fails the verdict even when no violation line could be read.
    unread = "Policies:\n    \u274c llmgw-fleet@v0.1.0 (local: /p)\n        - [mandatory] garbled\n"
    verdict = cli.policy_verdict(unread)
    assert verdict.startswith("**Policies: a mandatory rule is violated** (0 violations)") and "job's log" in verdict
    assert cli.policy_verdict("Policies:\n    \u2705 llmgw-fleet@v0.1.0 (local: /p)\n").startswith(
        "**Policies: no mandatory rule is violated** (0 violations)")


# --------------------------------------------------------------------------- restarts inside and outside a rollout


def test_a_node_that_restarts_both_under_and_outside_the_rollout_is_listed_outside_it():
    # A new certificate (NodeIdentity's update) restarts the agent whatever the rollout says: a node whose
    # AgentInstall also restarts under the rollout is not held back by it, so it is listed without a rollout.
    rollout = {"max_parallel": 1, "canary": False}
    both = cli.NodeReview("gpu-02", restart_gated=True, restart_ungated=True, rollout={**rollout, "canary": True})
    gated = cli.NodeReview("gpu-01", restart_gated=True, rollout=rollout)
    ungated = cli.NodeReview("gpu-03", restart_ungated=True)
    fleet = cli.FleetReview({r.node: r for r in (both, gated, ungated)})
    assert fleet.restart_order() == ([], ["gpu-01"], ["gpu-02", "gpu-03"], 1)
    summary = cli.markdown(fleet)
    assert "**Agents that will restart: 3**" in summary  # the two outside the rollout count too
    assert "1. then, in any order: `gpu-01`" in summary and "**without a rollout** (2): `gpu-02`, `gpu-03`" in summary
    assert "canaries" not in summary


def test_a_warning_about_a_node_is_kept_printable():
    data = preview()
    urn = next(s["urn"] for s in data["steps"] if s["urn"].endswith("EngineCheck::node14"))
    data["diagnostics"].append({"urn": urn, "severity": "warning",
                                "message": "warning: sglang \x1b]0;owned\x07 failed\u202e to start\n"})
    problems = cli.review(data, NOW).nodes["node14"].problems
    assert problems[-1] == "sglang \\x1b]0;owned\\x07 failed\\u202e to start", problems
    assert all(p.isprintable() for p in problems)


# --------------------------------------------------------------------------- onboarding


def test_onboarding_rows_say_the_version_the_fabric_and_how_host_keys_are_trusted():
    data = preview()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIESlTIP8BcEDr5XyyOQxwycPBVvJVjqJMrqxni4S7nbt"
    east = {"fabrics": [{"name": "ib-east", "hcas": ["mlx5_0", "mlx5_1"]}]}
    for node in ("gpu-20", "gpu-21", "gpu-22"):
        data["steps"] += created(data, node, agent=east, connection={"host_key": key})
    data["steps"] += created(data, "gpu-30", agent={"version": "v1.5.0"},
                             connection={"jump": [{"address": "deploy@bastion", "host_key": key}]})
    data["steps"] += created(data, "gpu-31", op="create-replacement",
                             agent={"version": "v1.6.0-dev", "binary_path": "/build/llmgw",
                                    "fabrics": [{"name": "ib-east", "hcas": ["mlx5_0"]}, {"name": "ib-west", "hcas": ["mlx5_1"]}]},
                             connection={"host_key": key, "jump": [{"address": "deploy@bastion"}]})
    fleet = cli.review(data, NOW)
    assert fleet.nodes["gpu-20"].version == "v1.4.2" and fleet.nodes["gpu-20"].fabrics == ("ib-east",)
    assert fleet.nodes["gpu-20"].host_keys == ("pinned",) and not fleet.nodes["gpu-20"].local_build
    assert fleet.nodes["gpu-30"].host_keys == ("trusted on first use", "pinned")
    assert fleet.nodes["gpu-31"].replaced and fleet.nodes["gpu-31"].local_build
    assert not fleet.nodes["node10"].version and not fleet.nodes["node10"].host_keys  # read for onboarded nodes only
    rows = [line for line in cli.markdown(fleet).splitlines() if line.startswith("| onboarded")]
    assert rows == [
        "| onboarded: agent `v1.4.2`, fabric `ib-east`, host key pinned | 3 | `gpu-20..22` |",
        "| onboarded: agent `v1.5.0`, no fabric, host key trusted on first use, jump host keys pinned | 1 | `gpu-30` |",
        "| onboarded again (another machine): agent `v1.6.0-dev` (a local build), fabrics `ib-east`, `ib-west`, "
        "host key pinned, jump host keys trusted on first use | 1 | `gpu-31` |",
    ]


# --------------------------------------------------------------------------- a failed preview


def run_review(tmp_path: Path, preview_json: str | None, *args: str, log: str | None = None) -> tuple[int, str]:
    argv = [str(tmp_path / "preview.json"), *args]
    if preview_json is not None:
        (tmp_path / "preview.json").write_text(preview_json)
    if log is not None:
        (tmp_path / "preview.log").write_text(log)
        argv += ["--preview-log", str(tmp_path / "preview.log")]
    (tmp_path / "policy.txt").write_text(POLICY_RUN)
    out = io.StringIO()
    status = cli.main([*argv, "--policy", str(tmp_path / "policy.txt")], stdout=out)
    return status, out.getvalue()


def test_a_failed_preview_says_so_first_lists_its_errors_and_fails(tmp_path):
    data = preview()
    urn = next(s["urn"] for s in data["steps"] if s["urn"].endswith("NodeIdentity::node12"))
    data["diagnostics"] += [
        {"urn": urn, "severity": "error", "message": "error: node12: sudo: a password is required\n"},
        {"urn": data["steps"][0]["urn"], "severity": "error", "message": "error: an unhandled error occurred\n"},
    ]
    log = ("error: preview failed: 1 error occurred\n    error: node12: sudo: a password is required\n"
           "Updating (test): no error here\n")
    status, summary = run_review(tmp_path, json.dumps(data), "--preview-status", "255", log=log)
    print(summary)
    lines = summary.splitlines()
    assert status == 1
    assert lines[0] == "### Fleet change — `test`: the preview FAILED (exit status 255)"
    errors = [line for line in lines if line.startswith("- ")]
    assert errors[:3] == ["- `node12`: `node12: sudo: a password is required`", "- `an unhandled error occurred`",
                          "- `preview failed: 1 error occurred`"], errors  # the log's copy of node12's error once
    assert "nodes" not in summary.split("**Policies")[0] and "untouched" not in summary
    assert "**Policies: a mandatory rule is violated**" in summary  # the policy run is still judged

    # The same JSON without the status: its errors fail it; a status that is not 0 fails a JSON without errors.
    assert run_review(tmp_path, json.dumps(data))[0] == 1
    status, summary = run_review(tmp_path, json.dumps(preview()), "--preview-status", "3")
    assert status == 1 and summary.startswith("### Fleet change — `test`: the preview FAILED (exit status 3)\n")
    assert "none was found in its JSON or its log" in summary
    # Without either, the same files make the usual summary.
    status, summary = run_review(tmp_path, json.dumps(preview()), "--preview-status", "0", log=log)
    assert status == 0 and summary.startswith("### Fleet change — `test`: 5 nodes") and "FAILED" not in summary


@pytest.mark.parametrize("written", [None, "", "  \n", "Previewing update (test):\nerror: no stack named 'x'\n", "[1, 2]"],
                         ids=["missing", "empty", "blank", "not JSON", "not a preview"])
def test_a_preview_whose_json_cannot_be_read_failed(tmp_path, capsys, written):
    status, summary = run_review(tmp_path, written, "--preview-status", "0",
                                 log="error: no stack named 'x' found\nerror: no stack named 'x' found\n")
    assert status == 2
    first = summary.splitlines()[0]
    assert first.startswith("### Fleet change: the preview FAILED (the preview") and "0 nodes" not in summary, first
    assert summary.count("- `no stack named 'x' found`") == 1, summary
    assert "run `pulumi preview --json | python -m llmgw_pulumi.preview.cli`" in capsys.readouterr().err
