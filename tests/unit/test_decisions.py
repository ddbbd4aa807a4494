"""The decisions the providers make and the review of a preview reads back (llmgw_pulumi.decisions).

Each decision is tabled once here, and each table is run through both sides: the provider itself (its diff, its
update, the warning it logs) and the review of a preview that holds the same recorded and new values
(``review.review``). A side that decides on its own again fails the table on that side.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from llmgw_pulumi import decisions, fleet_review, review
from llmgw_pulumi.decisions import CA_CHANGED, EXPIRES, KEY_LOST, KEY_ORIGIN_CHANGED
from llmgw_pulumi.providers import certificate

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
    urn = f"urn:pulumi:prod::fleet::{review.NODE_TYPE}$pulumi-python:dynamic/llmgw:ClientCertificate::gpu-01"
    inputs = {k: v for k, v in recorded.items() if k in WANTED}
    return {"steps": [{"urn": urn, "op": "update", "oldState": {"inputs": inputs, "outputs": recorded},
                       "newState": {"inputs": wanted}}], "diagnostics": []}


@pytest.mark.parametrize(("what", "recorded", "wanted", "reasons"), REISSUE, ids=IDS)
def test_the_review_says_the_reasons_decided(what: str, recorded: dict[str, Any], wanted: dict[str, Any],
                                             reasons: tuple[str, ...]) -> None:
    node = review.review(certificate_update(recorded, wanted), NOW).nodes["gpu-01"]
    assert node.certificate == tuple(fleet_review.REISSUE_WHY[r] for r in reasons), what


def test_a_window_not_known_yet_decides_nothing() -> None:
    from pulumi.output import Unknown

    due = {**RECORDED, "not_after": NOW.isoformat()}
    assert decisions.reissue(due, WANTED, NOW).reasons == (EXPIRES,)  # the control: known, it is due
    assert decisions.reissue(due, {**WANTED, "renew_before_hours": Unknown()}, NOW).reasons == ()
    unknown_in_json = review.review(certificate_update(due, {**WANTED, "renew_before_hours": review.UNKNOWN}), NOW)
    assert unknown_in_json.nodes["gpu-01"].certificate == ()
