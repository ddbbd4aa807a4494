"""The decisions the providers make and the review of a preview reads back (llmgw_pulumi.decisions).

Each decision is tabled once here, and each table is run through both sides: the provider itself (its diff, its
update, the warning it logs) and the review of a preview that holds the same recorded and new values
(``cli.review``). A side that decides on its own again fails the table on that side.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pulumi
import pytest

from llmgw_pulumi import decisions
from llmgw_pulumi.decisions import CA_CHANGED, EXPIRES, KEY_LOST, KEY_ORIGIN_CHANGED
from llmgw_pulumi.preview import changes as fleet_review
from llmgw_pulumi.preview import cli
from llmgw_pulumi.providers import certificate
from tests.unit import AGENT_YAML_COMMENTS, RELEASE_KEY, Mocks, fake_pem

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
CA_END = (NOW + 3650 * 24 * HOUR).isoformat()
WANTED = {"node_id": "gpu-01", "pki_dir": "/pki", "validity_hours": 100.0, "renew_before_hours": 10.0,
          "key_origin": "operator", "ca_fingerprint": "aa"}
RECORDED = {**WANTED, "not_after": (NOW + 50 * HOUR).isoformat(), "ca_not_after": CA_END, "serial": "1a"}
ON_NODE = {"key_origin": "node", "node_key": "held"}

REISSUE = [
    # (what, recorded (the outputs, which hold the inputs), wanted (the new inputs), the reasons)
    ("nothing changed", RECORDED, WANTED, ()),
    ("inside the renewal window", {**RECORDED, "not_after": (NOW + 5 * HOUR).isoformat()}, WANTED, (EXPIRES,)),
    ("the window's first instant", {**RECORDED, "not_after": (NOW + 10 * HOUR).isoformat()}, WANTED, (EXPIRES,)),
    ("a second before the window", {**RECORDED, "not_after": (NOW + 10 * HOUR + dt.timedelta(seconds=1)).isoformat()},
     WANTED, ()),
    ("the default window (720 h) of a stack that never set it",
     {**RECORDED, "not_after": (NOW + 700 * HOUR).isoformat()},
     {k: v for k, v in WANTED.items() if k != "renew_before_hours"}, (EXPIRES,)),
    ("inside the window, but already ending with its CA",
     {**RECORDED, "not_after": (NOW + 5 * HOUR).isoformat(), "ca_not_after": (NOW + 5 * HOUR).isoformat()},
     WANTED, ()),
    ("an expiry that is not a time", {**RECORDED, "not_after": "soon"}, WANTED, ()),
    ("no certificate recorded yet", {k: v for k, v in RECORDED.items() if k != "not_after"}, WANTED, ()),
    ("another CA", RECORDED, {**WANTED, "ca_fingerprint": "bb"}, (CA_CHANGED,)),
    ("the CA not known here (a reviewer without ca.pem)", RECORDED,
     {k: v for k, v in WANTED.items() if k != "ca_fingerprint"}, ()),
    ("a moved PKI dir", RECORDED, {**WANTED, "pki_dir": "/srv/pki"}, ()),
    ("the node holds its key", {**RECORDED, **ON_NODE}, {**WANTED, "key_origin": "node"}, ()),
    ("the node's key gone", {**RECORDED, **ON_NODE, "node_key": "gone"}, {**WANTED, "key_origin": "node"},
     (KEY_LOST,)),
    ("another key on the node", {**RECORDED, **ON_NODE, "node_key": "another key"},
     {**WANTED, "key_origin": "node"}, (KEY_LOST,)),
    ("the node's key not read yet", {**RECORDED, "key_origin": "node"}, {**WANTED, "key_origin": "node"}, ()),
    ("keyOrigin node to operator, the node's key gone", {**RECORDED, **ON_NODE, "node_key": "gone"}, WANTED,
     (KEY_ORIGIN_CHANGED,)),
    ("keyOrigin operator to node", RECORDED, {**WANTED, "key_origin": "node"}, (KEY_ORIGIN_CHANGED,)),
    ("every reason at once, in order", {**RECORDED, **ON_NODE, "node_key": "gone",
                                        "not_after": (NOW + HOUR).isoformat(), "key_origin": "operator"},
     {**WANTED, "ca_fingerprint": "bb", "key_origin": "node"}, (EXPIRES, CA_CHANGED, KEY_LOST, KEY_ORIGIN_CHANGED)),
]
IDS = [case[0] for case in REISSUE]


@pytest.mark.parametrize(("what", "recorded", "wanted", "reasons"), REISSUE, ids=IDS)
def test_the_reissue_decision(what: str, recorded: dict[str, Any], wanted: dict[str, Any],
                              reasons: tuple[str, ...]) -> None:
    decided = decisions.reissue(recorded, wanted, NOW)
    assert decided.reasons == reasons, what
    assert bool(decided) is bool(reasons)


def test_every_reason_is_named_by_the_provider_and_by_the_summary() -> None:
    assert set(certificate.REISSUE_REASONS) == set(decisions.REASONS) == set(fleet_review.REISSUE_WHY)
    assert [r for case in REISSUE for r in case[3]], "the table gives reasons"
    assert {r for case in REISSUE for r in case[3]} == set(decisions.REASONS), "the table gives every reason"


@pytest.mark.parametrize(("what", "recorded", "wanted", "reasons"), REISSUE, ids=IDS)
def test_the_certificate_provider_reissues_for_the_reasons_decided(
        what: str, recorded: dict[str, Any], wanted: dict[str, Any], reasons: tuple[str, ...],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(certificate, "_now", lambda: NOW)
    provider = certificate.ClientCertificateProvider()
    assert certificate.reissue_reasons(recorded, wanted, NOW) == list(reasons)
    diff = provider.diff("gpu-01:1", recorded, wanted)
    said = capsys.readouterr().err
    assert diff.replaces == []  # the same machine: an update in place, never a replacement
    if reasons:
        assert diff.changes, what
    for reason in decisions.REASONS:  # what the preview says under the resource, reason by reason
        text = certificate.REISSUE_REASONS[reason].split("{")[0]
        assert (text in said) is (reason in reasons), (what, reason, said)
    if not reasons:
        # No reason: the update carries the record forward without reaching the node (none is reachable here).
        outs = provider.update("gpu-01:1", recorded, wanted).outs
        assert outs.get("not_after") == recorded.get("not_after") and outs.get("serial") == recorded.get("serial")


def certificate_update(recorded: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """A preview in which gpu-01's ClientCertificate is updated from ``recorded`` to ``wanted``, as the engine's
    JSON writes it."""
    urn = f"urn:pulumi:prod::fleet::{cli.NODE_TYPE}$pulumi-python:dynamic/llmgw:ClientCertificate::gpu-01"
    inputs = {k: v for k, v in recorded.items() if k in WANTED}
    return {"steps": [{"urn": urn, "op": "update", "oldState": {"inputs": inputs, "outputs": recorded},
                       "newState": {"inputs": wanted}}], "diagnostics": []}


@pytest.mark.parametrize(("what", "recorded", "wanted", "reasons"), REISSUE, ids=IDS)
def test_the_review_says_the_reasons_decided(what: str, recorded: dict[str, Any], wanted: dict[str, Any],
                                             reasons: tuple[str, ...]) -> None:
    node = cli.review(certificate_update(recorded, wanted), NOW).nodes["gpu-01"]
    assert node.certificate == tuple(fleet_review.REISSUE_WHY[r] for r in reasons), what


def test_a_window_not_known_yet_decides_nothing() -> None:
    from pulumi.output import Unknown

    due = {**RECORDED, "not_after": NOW.isoformat()}
    assert decisions.reissue(due, WANTED, NOW).reasons == (EXPIRES,)  # the control: known, it is due
    assert decisions.reissue(due, {**WANTED, "renew_before_hours": Unknown()}, NOW).reasons == ()
    unknown_in_json = cli.review(certificate_update(due, {**WANTED, "renew_before_hours": cli.UNKNOWN}), NOW)
    assert unknown_in_json.nodes["gpu-01"].certificate == ()


# --------------------------------------------------------------------------- what touches the node

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"
# The node listens nowhere (port 1 of loopback refuses): a provider that reaches for it fails at once.
CONN = {"host": "127.0.0.1", "user": "deploy", "port": 1.0, "wait": 0.0, "private_key_path": "/k/id_fleet"}
AGENT = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "hostname": "gpu-01",
         "servers": ["cp1:7443"], "version": "v1.2.3", "release_url": "https://r.example/llmgw"}

OPERATOR_SIDE_CHANGES = [
    ("connection.user", {"connection": {**CONN, "user": "ops"}}),
    ("connection.wait", {"connection": {**CONN, "wait": 1.0}}),
    ("connection.jump", {"connection": {**CONN, "jump": [{"address": "deploy@127.0.0.1:1"}]}}),
    ("connection.private_key", {"connection": {**CONN, "private_key": fake_pem("OPENSSH PRIVATE KEY", "QQ==")}}),
    ("connection.private_key_path", {"connection": {**CONN, "private_key_path": "/k/id_other"}}),
    ("connection.passphrase", {"connection": {**CONN, "passphrase": "new"}}),
    ("known_jump_host_keys", {"known_jump_host_keys": {"127.0.0.1:1": "ssh-ed25519 AAAAB"}}),
]
NODE_CHANGES = [
    ("servers", {"servers": ["cp2:7443"]}),
    ("known_host_key", {"known_host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB"}),
]


def installed(inputs: dict[str, Any]) -> dict[str, Any]:
    """An AgentInstall's record after it installed ``inputs``: the node seen holding what they render (a record of
    the shape before state_version 1, read through its migration)."""
    import hashlib

    from llmgw_pulumi.nodestate import desired

    config = AGENT_YAML_COMMENTS.format(inputs["node_id"]) + inputs["agent_yaml"]  # as a package of that shape kept it
    seen = {"binary_sha256": "b" * 64, "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
            "unit_sha256": hashlib.sha256(desired.render_unit().encode()).hexdigest(), "active": "active",
            "enabled": "enabled"}
    return {**inputs, "agent_yaml": config, "installed_sha256": "b" * 64, "arch": "amd64", "node_state": seen}


def checked(provider: Any, news: dict[str, Any]) -> dict[str, Any]:
    res = provider.check({}, news)
    assert res.failures == [], res.failures
    return dict(res.inputs)


def agent_update(old_in: dict[str, Any], new_in: dict[str, Any]) -> dict[str, Any]:
    """A preview in which gpu-01's AgentInstall is updated from ``old_in`` to ``new_in``."""
    urn = f"urn:pulumi:prod::fleet::{cli.NODE_TYPE}$pulumi-python:dynamic/llmgw:AgentInstall::gpu-01"
    return {"steps": [{"urn": urn, "op": "update", "oldState": {"inputs": old_in, "outputs": old_in},
                       "newState": {"inputs": new_in}}], "diagnostics": []}


@pytest.mark.parametrize(("name", "change"), OPERATOR_SIDE_CHANGES, ids=[c[0] for c in OPERATOR_SIDE_CHANGES])
def test_an_operator_side_change_reaches_no_node_and_the_review_restarts_nothing(name: str,
                                                                                 change: dict[str, Any]) -> None:
    from llmgw_pulumi.providers import base
    from llmgw_pulumi.providers.agent import AgentInstallProvider
    from llmgw_pulumi.providers.engines import EngineCheckProvider

    assert decisions.operator_side_only([name]) and not decisions.touches_node([name])
    engines = {k: AGENT[k] for k in ("node_id", "connection", "known_host_key")}
    keys = ("connection", "known_jump_host_keys")
    for provider, inputs, record in ((AgentInstallProvider(), AGENT, installed), (EngineCheckProvider(), engines, dict)):
        olds = checked(provider, {**inputs, "known_jump_host_keys": {"127.0.0.1:1": HOST_KEY}})
        news = checked(provider, {**olds, **change})
        assert base.changed_keys(olds, news, keys) == [name]  # the change is the one named
        outs = provider.update("gpu-01", record(olds), news).outs  # reaching 127.0.0.1:1 would fail: not tried
        assert {k: outs.get(k) for k in keys} == {k: news.get(k) for k in keys}, provider
    olds = checked(AgentInstallProvider(), AGENT)
    node = cli.review(agent_update(olds, {**olds, **change}), NOW).nodes["gpu-01"]
    assert not node.restarts and node.untouched, name


@pytest.mark.parametrize(("name", "change"), NODE_CHANGES, ids=[c[0] for c in NODE_CHANGES])
def test_a_change_to_the_node_reaches_it_and_the_review_restarts_the_agent(name: str, change: dict[str, Any]) -> None:
    from llmgw_pulumi import errors
    from llmgw_pulumi.providers.agent import AgentInstallProvider

    assert decisions.touches_node([name]) and not decisions.operator_side_only([name])
    provider = AgentInstallProvider()
    olds = installed(checked(provider, AGENT))
    news = checked(provider, {**AGENT, **change})
    with pytest.raises(errors.UnreachableError):  # it reaches for the node, which is not there
        provider.update("gpu-01", olds, news)
    node = cli.review(agent_update(checked(provider, AGENT), news), NOW).nodes["gpu-01"]
    assert node.restart_gated and not node.untouched, name


def agent_inputs() -> set[str]:
    """Every input an AgentInstall records: its Args' fields, those of the dataclasses it flattens, what check
    derives."""
    import dataclasses

    from llmgw_pulumi.providers import agent
    from llmgw_pulumi.providers.agent import AgentInstallArgs

    found = {"agent_yaml", "unit"}  # derived by check
    for f in dataclasses.fields(AgentInstallArgs):
        flattened = vars(agent)[f.type] if f.metadata.get("flatten") else None  # AgentSettings, BinarySource
        found |= {g.name for g in dataclasses.fields(flattened)} if flattened else {f.name}
    return found


def test_what_the_agent_s_diff_does_not_compare_never_restarts_it_in_the_review() -> None:
    from llmgw_pulumi.providers import agent

    recorded = agent_inputs()
    assert {"servers", "version", "rollout", "registration", "release_sha256"} <= recorded, recorded  # the control
    assert recorded - set(agent.INPUT_KEYS) <= decisions.NOT_NODE_CHANGES
    assert not decisions.NOT_NODE_CHANGES & set(agent.INPUT_KEYS)


def test_every_input_named_by_a_decision_is_an_input_of_a_resource() -> None:
    # A renamed input would leave its old name here, deciding nothing.
    import dataclasses

    from llmgw_pulumi.config.specs import Connection
    from llmgw_pulumi.providers import certificate as cert

    inputs = agent_inputs() | {f.name for f in dataclasses.fields(cert.ClientCertificateArgs)}
    inputs |= {f"connection.{f.name}" for f in dataclasses.fields(Connection)}
    engine_inputs = {"__provider", "__urn", "drift"}  # the engine's, an earlier version's, and what a refresh found
    assert (decisions.NOT_NODE_CHANGES | decisions.OPERATOR_SIDE) - engine_inputs <= inputs


# --------------------------------------------------------------------------- type tokens


@pytest.fixture
def mocked() -> None:
    pulumi.runtime.set_mocks(Mocks(), preview=False)


def as_the_engine_writes(urn: str) -> str:
    """A URN from the SDK's mock engine, which keeps the stack's type as its children's parent: the engine leaves
    it out."""
    return urn.replace("::pulumi:pulumi:Stack$", "::")


def read_as_the_review_reads(urns: list[str]) -> list[str]:
    """The kinds the review tells resources by (``kind_of``), for those it reads, sorted."""
    kinds = [cli.kind_of(as_the_engine_writes(urn)) for urn in urns]
    return sorted(k for k in kinds if k in (cli.NODE_TYPE, cli.CERTIFICATE, cli.IDENTITY, cli.AGENT,
                                            cli.ENGINES))


EVERY_KIND = sorted([decisions.NODE_TYPE, decisions.CERTIFICATE, decisions.IDENTITY, decisions.AGENT, decisions.ENGINES])


@pulumi.runtime.test
def test_the_review_reads_the_types_a_program_s_node_registers(mocked: None) -> Any:
    from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, Node, NodeArgs

    node = Node("gpu-01", NodeArgs(node_id="gpu-01", connection=ConnectionArgs(host="10.0.0.11", private_key_path="/k"),
                                   settings=AgentSettings(servers=["cp:7443"]), pki_dir="/pki",
                                   binary=BinarySource(version="v1.4.2", release_url="https://r",
                                                       signing_key=RELEASE_KEY)))

    def check(urns: list[str]) -> None:
        assert as_the_engine_writes(urns[0]).endswith(f"::{decisions.NODE_TYPE}::gpu-01"), urns  # top-level
        assert read_as_the_review_reads(urns) == EVERY_KIND, urns

    return pulumi.Output.all(node.urn, node.certificate.urn, node.identity.urn, node.agent.urn,
                             node.engine_check.urn).apply(check)


@pulumi.runtime.test
def test_the_review_reads_the_type_the_component_s_node_registers(mocked: None, tmp_path: Any) -> Any:
    from llmgw_pulumi.stack import component

    key = tmp_path / "id_ed25519"
    key.write_text("read only when a node is reached")
    key.chmod(0o600)
    node = component.Node("gpu-02", {"nodeId": "gpu-02", "address": "10.0.0.12", "pkiDir": "/pki",
                                      "servers": ["cp1:7443"], "ssh": {"user": "deploy", "privateKeyPath": str(key)},
                                      "agent": {"version": "v1.4.2", "releaseUrl": "https://releases.example.net",
                                                "sha256": {"amd64": "a" * 64}}})

    def check(urns: list[str]) -> None:
        # Its four resources are made by the same function as the program's Node's (``node.onboard``).
        assert read_as_the_review_reads(urns) == [decisions.NODE_TYPE], urns

    return pulumi.Output.all(node.urn, node.problems).apply(lambda both: check(both[:1]))


# --------------------------------------------------------------------------- a node a refresh could not read


def test_a_node_a_refresh_could_not_read_is_marked_by_the_provider_and_read_so_by_the_review(
        capsys: pytest.CaptureFixture[str]) -> None:
    from llmgw_pulumi.providers.agent import AgentInstallProvider
    from llmgw_pulumi.providers.engines import EngineCheckProvider

    engines = checked(EngineCheckProvider(), {k: AGENT[k] for k in ("node_id", "connection", "known_host_key")})
    recorded = {**engines, "problems": [], "engines_ok": True}
    assert EngineCheckProvider().read("gpu-01", recorded).outs == recorded  # the record is kept as it was
    agent = installed(checked(AgentInstallProvider(), AGENT))
    kept = AgentInstallProvider().read("gpu-01", agent).outs  # read through its migration to the current shape
    assert (kept["installed_sha256"], kept["version"]) == (agent["installed_sha256"], agent["version"])
    # Each record the providers log starts a line with its level; its fix follows on the next lines.
    records = re.split(r"^(?=warning: |info: )", capsys.readouterr().err, flags=re.MULTILINE)
    said = [record for record in records if record.startswith("warning: ")]
    assert len(said) == 2 and all("cannot reach deploy@127.0.0.1" in record for record in said), said
    # What the engine shows under each resource (the provider's log, as a diagnostic), read by the review.
    urn = f"urn:pulumi:prod::fleet::{decisions.NODE_TYPE}$pulumi-python:dynamic/llmgw:{{}}::gpu-01"
    refreshed = {"steps": [{"urn": urn.format(kind), "op": "refresh", "newState": {"inputs": {}, "outputs": {}}}
                           for kind in (decisions.ENGINES, decisions.AGENT)],
                 "diagnostics": [{"urn": urn.format(kind), "severity": "warning", "message": record}
                                 for kind, record in zip((decisions.ENGINES, decisions.AGENT), said, strict=True)]}
    node = cli.review(refreshed, NOW).nodes["gpu-01"]
    assert len(node.unreadable) == 1 and node.unreadable[0].startswith("gpu-01: cannot reach deploy@127.0.0.1")
    assert decisions.UNREADABLE_MARK not in node.unreadable[0] and not node.problems


@pytest.mark.parametrize("message", [
    "gpu-01: cannot reach deploy@10.0.0.9 over ssh after 10s; its state is kept as it was",  # the words, unmarked
    f"vllm printed {decisions.UNREADABLE_MARK} and exited (fix: see its log)",  # the mark, not last
])
def test_only_the_providers_mark_says_a_node_could_not_be_read(message: str) -> None:
    assert decisions.unreadable_reason(message) is None
    urn = f"urn:pulumi:prod::fleet::{decisions.NODE_TYPE}$pulumi-python:dynamic/llmgw:{decisions.ENGINES}::gpu-01"
    preview = {"steps": [{"urn": urn, "op": "refresh", "newState": {"inputs": {}, "outputs": {}}}],
               "diagnostics": [{"urn": urn, "severity": "warning", "message": f"warning: {message}\n"}]}
    node = cli.review(preview, NOW).nodes["gpu-01"]
    assert not node.unreadable and node.problems == [message]
    marked = decisions.unreadable_warning("gpu-01: cannot reach deploy@10.0.0.9 over ssh after 10s")
    assert decisions.unreadable_reason(marked + "\n") == \
        "gpu-01: cannot reach deploy@10.0.0.9 over ssh after 10s; its state is kept as it was"  # the control
