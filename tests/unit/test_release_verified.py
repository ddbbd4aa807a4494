"""Unverified releases are refused by default, pins are per version, and the release-verified rule judges the
record the program makes of how each node's release is verified, whatever way the config was given."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.errors import InputPropertiesError

from llmgw_pulumi.boundary import to_inputs
from llmgw_pulumi.config import node_list, stack_config
from llmgw_pulumi.config.agent_settings import BinarySource
from llmgw_pulumi.config.specs import AgentSettings
from llmgw_pulumi.errors import ConfigError, StackConfigError
from llmgw_pulumi.preview import changes, rules
from llmgw_pulumi.preview import markdown as review_markdown
from llmgw_pulumi.releases import policy as release_policy
from llmgw_pulumi.stack import component, program
from llmgw_pulumi.stack.node import ConnectionArgs, NodeArgs, check_node_args, recorded_binary
from tests.unit import RELEASE_KEY

KEY = RELEASE_KEY
OLD, NEW = "a" * 64, "b" * 64
URL = "https://releases.example.net/llmgw"
TOP: dict[str, Any] = {
    "pkiDir": "/srv/llmgw/pki", "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "releaseUrl": URL},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"},
}
NODES = [{"id": "gpu-01", "address": "10.0.0.11"}, {"id": "gpu-02", "address": "10.0.0.12"},
         {"id": "gpu-03", "address": "10.0.0.13", "agent": {"version": "v1.5.0"}}]  # the README's canary


def config(agent: dict[str, Any] | None = None, nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {**TOP, "agent": {**TOP["agent"], **(agent or {})}, "nodes": copy.deepcopy(nodes or NODES)}


def refused(parse: Any) -> list[tuple[str, str, str, str]]:
    with pytest.raises(StackConfigError) as caught:
        parse()
    return [p for p in caught.value.problems if p[1] == "agent.signingKey"]


def recorded(spec: stack_config.StackSpec) -> dict[str, dict[str, Any]]:
    """node id -> its AgentInstall's inputs as the program registers them in a preview (no network: pins only)."""
    out = {}
    for n in spec.nodes:
        binary = program.agent_inputs(n.agent or spec.agent, dry_run=True)
        out[n.node_id] = {"node_id": n.node_id, **(to_inputs(binary) or {})}
    return out


def verdicts(inputs: dict[str, dict[str, Any]], **policy: Any) -> dict[str, str | None]:
    return {node: rules.release_verified(changes.AGENT, props, policy) for node, props in inputs.items()}


# --------------------------------------------------------------------------- the refusal, before anything happens


def test_a_release_nothing_verifies_is_refused_with_one_error_per_node_naming_the_field_and_the_fix():
    found = refused(lambda: stack_config.parse(config()))
    assert [node for node, *_ in found] == ["node gpu-01", "node gpu-02", "node gpu-03"]
    for _, field, _, fix in found:
        assert field == "agent.signingKey"
        assert "pulumi config set --path llmgw:agent.signingKey" in fix
        assert "allowUnverifiedRelease" in fix
    # The canary's own version is named, and the pin command keys it by that version.
    assert "v1.5.0" in found[2][2] and 'llmgw:agent.sha256["v1.5.0"].amd64' in found[2][3]
    # Its own opt-out is at its own place in llmgw:nodes; the others' is the stack's.
    assert "llmgw:nodes[2].agent.allowUnverifiedRelease" in found[2][3]
    assert "llmgw:agent.allowUnverifiedRelease" in found[0][3]


def test_a_signing_key_verifies_every_node_and_is_recorded_as_a_signature():
    spec = stack_config.parse(config({"signingKey": KEY}))
    assert {n: i["verification"] for n, i in recorded(spec).items()} == dict.fromkeys(
        ("gpu-01", "gpu-02", "gpu-03"), release_policy.SIGNATURE)
    assert set(verdicts(recorded(spec)).values()) == {None}


def test_the_opt_out_allows_it_records_it_and_the_rule_fails_it_unless_the_policy_allows_it():
    spec = stack_config.parse(config({"allowUnverifiedRelease": True}))
    inputs = recorded(spec)
    assert {i["verification"] for i in inputs.values()} == {release_policy.OPT_OUT}
    assert all(i["allow_unverified_release"] is True for i in inputs.values())
    judged = verdicts(inputs)
    assert all(v and "allowUnverifiedRelease" in v for v in judged.values()), judged
    assert set(verdicts(inputs, allowUnverifiedRelease=True).values()) == {None}


def test_the_opt_out_must_be_true():
    with pytest.raises(StackConfigError) as caught:
        stack_config.parse(config({"allowUnverifiedRelease": "yes"}))
    assert {p[1] for p in caught.value.problems} == {"agent.allowUnverifiedRelease"}


# --------------------------------------------------------------------------- pins per version


def test_pins_are_per_version_and_a_node_on_another_version_finds_its_own():
    spec = stack_config.parse(config({"sha256": {"v1.4.2": {"amd64": OLD}, "v1.5.0": {"amd64": NEW}}}))
    inputs = recorded(spec)
    assert {n: (i["verification"], i["release_sha256"]) for n, i in inputs.items()} == {
        "gpu-01": ("pin", {"amd64": OLD}), "gpu-02": ("pin", {"amd64": OLD}), "gpu-03": ("pin", {"amd64": NEW})}
    assert set(verdicts(inputs).values()) == {None}


def test_pins_of_the_stacks_version_do_not_verify_a_node_on_another_version():
    # N2: the stack pins v1.4.2; the canary on v1.5.0 got no pins and no key, and the rule said nothing.
    found = refused(lambda: stack_config.parse(config({"sha256": {"amd64": OLD}})))
    assert [node for node, *_ in found] == ["node gpu-03"]


def test_both_forms_of_pins_may_be_given_together():
    spec = stack_config.parse(config({"sha256": {"amd64": OLD, "v1.5.0": {"amd64": NEW}}}))
    assert {n: i["release_sha256"] for n, i in recorded(spec).items()} == {
        "gpu-01": {"amd64": OLD}, "gpu-02": {"amd64": OLD}, "gpu-03": {"amd64": NEW}}


def test_a_nodes_own_pins_are_for_its_own_version():
    nodes = [{**NODES[2], "agent": {"version": "v1.5.0", "sha256": {"amd64": NEW}}}]
    spec = stack_config.parse(config({"sha256": {"amd64": OLD}}, nodes))
    assert recorded(spec)["gpu-03"]["release_sha256"] == {"amd64": NEW}


@pytest.mark.parametrize("pins, field", [
    ({"1.5.0": {"amd64": NEW}}, "agent.sha256"),           # not a tag
    ({"v1.5.0": {"amd64": "short"}}, "agent.sha256"),      # not a digest
    ({"v1.5.0": {}}, "agent.sha256"),                       # no pins
])
def test_bad_pins_per_version_are_named(pins, field):
    with pytest.raises(StackConfigError) as caught:
        stack_config.parse(config({"signingKey": KEY, "sha256": pins}))
    assert field in [p[1] for p in caught.value.problems]


# --------------------------------------------------------------------------- node list files


CSV = "id,address,agent.version,agent.sha256.amd64,agent.allowUnverifiedRelease\n" \
      "gpu-01,10.0.0.11,,,\n" \
      "gpu-03,10.0.0.13,v1.5.0,{pin},{opt_out}\n"


def from_csv(tmp_path: Path, agent: dict[str, Any], pin: str = "", opt_out: str = "") -> Any:
    (tmp_path / "rack.csv").write_text(CSV.format(pin=pin, opt_out=opt_out))
    top = {**TOP, "agent": {**TOP["agent"], **agent}, "inventory": "rack.csv"}
    return lambda: node_list.parse(top, tmp_path)


def test_a_node_list_row_on_another_version_is_refused_naming_the_file_line(tmp_path):
    found = refused(from_csv(tmp_path, {"sha256": {"amd64": OLD}}))
    assert [node for node, *_ in found] == ["rack.csv line 3 (node gpu-03)"]
    assert "in the file" in found[0][3]


def test_a_node_list_rows_pin_is_for_its_version(tmp_path):
    inputs = recorded(from_csv(tmp_path, {"sha256": {"amd64": OLD}}, pin=NEW)())
    assert {n: (i["verification"], i["release_sha256"]) for n, i in inputs.items()} == {
        "gpu-01": ("pin", {"amd64": OLD}), "gpu-03": ("pin", {"amd64": NEW})}
    assert set(verdicts(inputs).values()) == {None}


def test_a_node_list_rows_opt_out_is_recorded_and_judged(tmp_path):
    inputs = recorded(from_csv(tmp_path, {"signingKey": KEY, "sha256": {"amd64": OLD}}, opt_out="true")())
    # The key verifies every version: the row's opt-out changes nothing there.
    assert {n: i["verification"] for n, i in inputs.items()} == {"gpu-01": "pin", "gpu-03": "signature"}
    inputs = recorded(from_csv(tmp_path, {"sha256": {"amd64": OLD}}, opt_out="true")())
    assert {n: i["verification"] for n, i in inputs.items()} == {"gpu-01": "pin", "gpu-03": "opt-out"}
    judged = verdicts(inputs)
    assert judged["gpu-01"] is None and "gpu-03" in (judged["gpu-03"] or "")


# --------------------------------------------------------------------------- component inputs


COMPONENT = {"nodeId": "gpu-03", "address": "10.0.0.13", "pkiDir": "/pki", "servers": ["cp1:7443"],
             "agent": {"version": "v1.5.0", "releaseUrl": URL},
             "ssh": {"user": "deploy", "privateKeyPath": "/keys/id_ed25519"}}


def component_inputs(agent: dict[str, Any]) -> dict[str, dict[str, Any]]:
    parsed = component.parse("gpu-03", {**COMPONENT, "agent": {**COMPONENT["agent"], **agent}})
    return recorded(parsed.spec)


def test_component_inputs_without_a_key_or_a_pin_are_refused_before_anything_is_registered():
    with pytest.raises(InputPropertiesError) as caught:
        component.parse("gpu-03", COMPONENT)
    assert "agent.signingKey" in str(caught.value) and "allowUnverifiedRelease" in str(caught.value)


def test_component_inputs_pins_per_version_and_opt_out_are_recorded_and_judged():
    pinned = component_inputs({"sha256": {"v1.4.2": {"amd64": OLD}, "v1.5.0": {"amd64": NEW}}})
    assert pinned["gpu-03"]["verification"] == "pin" and pinned["gpu-03"]["release_sha256"] == {"amd64": NEW}
    assert verdicts(pinned) == {"gpu-03": None}
    opted = component_inputs({"allowUnverifiedRelease": True})
    assert opted["gpu-03"]["verification"] == "opt-out"
    assert "gpu-03" in (verdicts(opted)["gpu-03"] or "")


# --------------------------------------------------------------------------- a program's own NodeArgs


def own(binary: BinarySource) -> NodeArgs:
    return NodeArgs(node_id="gpu-09", connection=ConnectionArgs(host="10.0.0.19", user="deploy"), pki_dir="/pki",
                    settings=AgentSettings(servers=["cp1:7443"]), binary=binary)


@pytest.mark.parametrize("binary, record", [
    (BinarySource(version="v1.5.0", release_url=URL, signing_key=KEY), "signature"),
    (BinarySource(version="v1.5.0", release_url=URL, release_sha256={"amd64": NEW}), "pin"),
    (BinarySource(version="v1.5.0", release_url=URL, allow_unverified_release=True), "opt-out"),
    (BinarySource(version="dev", binary_path="/build/llmgw", binary_sha256=NEW), "local build"),
])
def test_a_programs_own_node_args_are_recorded_and_judged(binary, record):
    made = recorded_binary("gpu-09", binary)
    assert made.verification == record
    inputs = {"node_id": "gpu-09", **(to_inputs(made) or {})}
    judged = rules.release_verified(changes.AGENT, inputs, {})
    assert (judged is None) == (record in ("signature", "pin")), judged
    assert check_node_args(own(made)) == []


def test_a_programs_own_unverified_release_is_refused_before_any_resource():
    bare = BinarySource(version="v1.5.0", release_url=URL)
    with pytest.raises(ConfigError) as caught:
        recorded_binary("gpu-09", bare)
    assert caught.value.field == "binary.signing_key" and caught.value.fix
    assert [e.field for e in check_node_args(own(bare))] == ["binary.signing_key"]


def test_a_record_the_inputs_do_not_bear_out_is_refused_by_the_check_and_by_the_rule():
    lying = BinarySource(version="v1.5.0", release_url=URL, allow_unverified_release=True, verification="signature")
    assert [e.field for e in check_node_args(own(lying))] == ["binary.verification"]
    inputs = {"node_id": "gpu-09", **(to_inputs(lying) or {})}
    assert "signing_key" in (rules.release_verified(changes.AGENT, inputs, {}) or "")


def test_a_release_with_no_record_fails_the_rule_and_an_unknown_one_waits_for_up():
    props = {"node_id": "gpu-01", "version": "v1.5.0", "release_url": URL, "signing_key": KEY}
    assert "no record" in (rules.release_verified(changes.AGENT, props, {}) or "")
    unknown = {**props, "verification": changes.UNKNOWN}
    assert rules.release_verified(changes.AGENT, unknown, {}) is None
    assert rules.release_verified(changes.IDENTITY, props, {}) is None


def test_a_local_build_passes_only_when_dev_builds_are_allowed():
    props = {"node_id": "gpu-01", "version": "dev", "binary_path": "/b/llmgw", "verification": "local build"}
    assert "local build" in (rules.release_verified(changes.AGENT, props, {}) or "")
    assert rules.release_verified(changes.AGENT, props, {"allowDevBuild": True}) is None
    # Allowing the opt-out does not allow a local build, nor the other way round.
    assert rules.release_verified(changes.AGENT, props, {"allowUnverifiedRelease": True})
    opted = {**props, "binary_path": None, "verification": "opt-out", "allow_unverified_release": True}
    assert rules.release_verified(changes.AGENT, opted, {"allowDevBuild": True})


# --------------------------------------------------------------------------- the warning, in the summary


def test_the_opt_out_warning_is_a_line_of_the_pull_request_summary():
    urn = "urn:pulumi:prod::fleet::llmgw:index:Node$pulumi-python:dynamic/llmgw:AgentInstall::gpu-0{}"
    preview = {"steps": [], "diagnostics": [
        {"urn": urn.format(i), "severity": "warning",
         "message": release_policy.unverified_warning(f"gpu-0{i}", "v1.5.0")} for i in (1, 2)] + [
        {"urn": urn.format(3), "severity": "warning", "message": "something else"}]}
    fleet = changes.review(preview, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert fleet.group(lambda r: r.unverified_release) == ["gpu-01", "gpu-02"]
    text = review_markdown.markdown(fleet)
    assert "Unverified releases" in text and "`gpu-01`, `gpu-02`" in text.split("Unverified releases")[1].split("\n")[0]
    assert "Unverified releases" not in review_markdown.markdown(changes.review({"steps": []}))


def test_the_program_warns_under_each_node_that_opted_out(monkeypatch):
    warned: list[tuple[str, Any]] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, resource=None, *a, **k: warned.append((message, resource)))
    from llmgw_pulumi.stack import node as node_module

    class Agent:
        pass

    agent = Agent()
    binary = recorded_binary("gpu-09", BinarySource(version="v1.5.0", release_url=URL, allow_unverified_release=True))
    node_module.warn_if_unverified(agent, "gpu-09", binary)  # type: ignore[arg-type]
    signed = recorded_binary("gpu-08", BinarySource(version="v1.5.0", release_url=URL, signing_key=KEY))
    node_module.warn_if_unverified(agent, "gpu-08", signed)  # type: ignore[arg-type]
    assert len(warned) == 1 and warned[0][1] is agent
    assert release_policy.UNVERIFIED_WARNING in warned[0][0] and warned[0][0].startswith("gpu-09")
