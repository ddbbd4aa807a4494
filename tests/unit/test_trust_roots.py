"""Trust-root changes (issue 36, item 4): each trust root's change is found, shown as a fingerprint or a plain
value (never the key, certificate or URL itself), is a row of its own in the summary, and fails the
``trust-roots-unchanged`` rule unless the policy config approves the value it changes to.

The fingerprints expected are the ones ssh-keygen printed for these keys, and the one the cryptography library
computes for a certificate made here: not computed by the code under test.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw_pulumi.config.agent_settings import BinarySource
from llmgw_pulumi.preview import cli, rules, trust_roots
from llmgw_pulumi.preview.changes import AGENT, CERTIFICATE, ENGINES, IDENTITY, UNKNOWN
from llmgw_pulumi.preview.trust_roots import NOT_KNOWN, NOT_SET, Change
from tests.unit.inert_markdown import PARSER, assert_marker_only_in_code, leaves
from tests.unit.review_previews import NOW, created, preview, step

# Made with `ssh-keygen -t ed25519`; the fingerprints are what `ssh-keygen -lf` printed for them.
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFyY2bL6Q6v7VwdYe6J3fDQnqFxgCdoe2dBlMguT3yt8"
FP_A = "SHA256:6eGFaclKSXxqh8MOjFlQvpEsYN2MByXlk9j1zHHygkk"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMAUFeVoInUiC8CaalfrMsVATaOByCF7Eufc8whtSBEf"
FP_B = "SHA256:fkQyyEVuLp7S/feHKFEylSswXZqYrbCHOmGl4QOJptc"
KEY_C = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFmXFNInm+Bqr4ojS1innHoq9XpkhxnLNH1mOg6Dg84Y"
FP_C = "SHA256:WBWTBKkwgUJV0JzwYDP53hFW7+hXOvAC6XvTnXbz6HI"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
DIGEST_1, DIGEST_2 = "1" * 64, "2" * 64


def certificate(name: str) -> tuple[str, str]:
    """A self-signed CA certificate made here: (its PEM, ``sha256:`` of its DER form as cryptography computes it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode(), "sha256:" + cert.fingerprint(hashes.SHA256()).hex()


CA_1, CA_2 = certificate("ca-1"), certificate("ca-2")
AGENT_INPUTS = {"node_id": "gpu-01", "version": "v1.4.2", "release_url": "https://releases.example.net/llmgw",
                "signing_key": KEY_A}
CERT_INPUTS = {"node_id": "gpu-01", "pki_dir": "/srv/pki", "ca_fingerprint": CA_1[1].removeprefix("sha256:")}
CONNECTION = {"host": "10.0.0.11", "user": "deploy", "host_key": KEY_B}

# (kind, old inputs, new inputs, the change expected): one or more per trust root.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], Change]] = {
    "signing key swapped": (AGENT, AGENT_INPUTS, {**AGENT_INPUTS, "signing_key": KEY_C},
                            Change("agent.signingKey", FP_A, FP_C)),
    "signing key removed": (AGENT, AGENT_INPUTS, {**AGENT_INPUTS, "signing_key": None},
                            Change("agent.signingKey", FP_A, NOT_SET)),
    "pins of the same release changed": (
        AGENT, {**AGENT_INPUTS, "release_sha256": {"x86_64": DIGEST_1}},
        {**AGENT_INPUTS, "release_sha256": {"x86_64": DIGEST_2, "aarch64": DIGEST_1}},
        Change("agent.sha256", f"x86_64 {DIGEST_1}", f"aarch64 {DIGEST_1}, x86_64 {DIGEST_2}")),
    "release CA added": (AGENT, AGENT_INPUTS, {**AGENT_INPUTS, "release_ca": "/home/ci/evil-ca.pem"},
                         Change("agent.releaseCa", NOT_SET, "/home/ci/evil-ca.pem")),
    "release server moved": (AGENT, AGENT_INPUTS, {**AGENT_INPUTS, "release_url": "https://mirror.evil.example:8443/x"},
                             Change("agent.releaseUrl", "releases.example.net", "mirror.evil.example:8443")),
    "signer kind": (CERTIFICATE, CERT_INPUTS,
                    {**CERT_INPUTS, "signer": {"kind": "caKey", "ca_pem": CA_1[0]}},
                    Change("signer.kind", "pkiDir", "caKey")),
    "signer command": (CERTIFICATE, {**CERT_INPUTS, "signer": {"kind": "command", "command": ["/opt/sign"]}},
                       {**CERT_INPUTS, "signer": {"kind": "command", "command": ["/tmp/x/sign"]}},
                       Change("signer.command", "/opt/sign", "/tmp/x/sign")),
    "CA rotated": (CERTIFICATE, CERT_INPUTS, {**CERT_INPUTS, "ca_fingerprint": CA_2[1].removeprefix("sha256:")},
                   Change("ca", CA_1[1], CA_2[1])),
    "signer CA without a recorded fingerprint": (
        CERTIFICATE, {"node_id": "gpu-01", "signer": {"kind": "caKey", "ca_pem": CA_1[0]}},
        {"node_id": "gpu-01", "signer": {"kind": "caKey", "ca_pem": CA_2[0]}}, Change("ca", CA_1[1], CA_2[1])),
    "host key pin swapped": (IDENTITY, {"connection": CONNECTION}, {"connection": {**CONNECTION, "host_key": KEY_C}},
                             Change("hostKey", FP_B, FP_C)),
    "host key pin dropped": (ENGINES, {"connection": CONNECTION}, {"connection": {**CONNECTION, "host_key": None}},
                             Change("hostKey", FP_B, NOT_SET)),
    "jump host added": (AGENT, {"connection": CONNECTION},
                        {"connection": {**CONNECTION, "jump": [{"address": "deploy@bastion.evil.example:2222"}]}},
                        Change("ssh.jump", NOT_SET, "bastion.evil.example:2222 (key not pinned)")),
    "jump host key pin swapped": (
        CERTIFICATE, {"connection": {**CONNECTION, "jump": [{"address": "deploy@bastion", "host_key": KEY_A}]}},
        {"connection": {**CONNECTION, "jump": [{"address": "deploy@bastion", "host_key": KEY_C}]}},
        Change("ssh.jump", f"bastion (key {FP_A})", f"bastion (key {FP_C})")),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_trust_root_change_is_found_as_fingerprints_or_plain_values(case):
    kind, old, new, expected = CASES[case]
    assert trust_roots.changes(kind, old, new) == [expected]
    assert trust_roots.changes(kind, new, new) == [] and trust_roots.changes(kind, old, copy.deepcopy(old)) == []


def test_every_declared_trust_root_has_a_case_and_a_documented_setting():
    assert {c[3].setting for c in CASES.values()} == set(trust_roots.SETTINGS)
    text = OPERATIONS.read_text()
    assert [s for s in trust_roots.SETTINGS if f"| `{s}` |" not in text] == []


@pytest.mark.parametrize("kind", [AGENT, IDENTITY])
def test_a_setting_is_read_only_from_the_resources_that_carry_it(kind):
    # The signing key is AgentInstall's, the signer ClientCertificate's: another resource's inputs say nothing.
    found = trust_roots.changes(kind, {**AGENT_INPUTS, **CERT_INPUTS}, {"signing_key": KEY_C, "signer": {"kind": "caKey"}})
    assert [c.setting for c in found] == (["agent.signingKey", "agent.releaseUrl"] if kind == AGENT else [])


def test_what_is_shown_is_never_the_key_the_certificate_or_the_urls_path_or_credentials():
    old = {**CERT_INPUTS, "signer": {"kind": "caKey", "ca_pem": CA_1[0]}, "connection": CONNECTION}
    new = {**CERT_INPUTS, "signer": {"kind": "caKey", "ca_pem": CA_2[0]}, "ca_fingerprint": None,
           "connection": {**CONNECTION, "host_key": KEY_C}}
    agent_new = {**AGENT_INPUTS, "signing_key": KEY_C, "release_url": "https://user:s3cret@other.example/path/x"}
    shown = json.dumps([*map(vars, trust_roots.changes(CERTIFICATE, old, new)),
                        *map(vars, trust_roots.changes(AGENT, AGENT_INPUTS, agent_new))])
    assert "other.example" in shown and FP_C in shown  # the positive control: the change is there
    for secret_or_whole in ("s3cret", "user", "/path/x", KEY_C.split()[1], "BEGIN CERTIFICATE",
                            CA_2[0].splitlines()[1]):
        assert secret_or_whole not in shown


def test_pins_are_compared_for_the_same_release_and_only_when_the_preview_holds_them():
    pinned = {**AGENT_INPUTS, "release_sha256": {"x86_64": DIGEST_1}}
    upgraded = {**AGENT_INPUTS, "version": "v1.5.0", "release_sha256": {"x86_64": DIGEST_2}}
    assert trust_roots.changes(AGENT, pinned, upgraded) == []  # another release, other digests: an upgrade
    assert trust_roots.changes(AGENT, pinned, {**AGENT_INPUTS}) == []  # a preview that pins nothing leaves them out


def test_a_value_a_preview_cannot_know_is_a_change_to_judge():
    found = trust_roots.changes(CERTIFICATE, {**CERT_INPUTS, "signer": {"kind": "command", "command": ["/opt/sign"]}},
                                {**CERT_INPUTS, "signer": UNKNOWN})
    assert Change("signer.command", "/opt/sign", NOT_KNOWN) in found
    assert trust_roots.changes(AGENT, AGENT_INPUTS, {**AGENT_INPUTS, "signing_key": UNKNOWN}) == [
        Change("agent.signingKey", FP_A, NOT_KNOWN)]
    assert trust_roots.changes(IDENTITY, {"connection": CONNECTION}, {"connection": {**CONNECTION, "host_key": UNKNOWN}}) \
        == [Change("hostKey", FP_B, NOT_KNOWN)]


def test_an_empty_value_is_the_same_as_none():
    # Stacks record no jump hosts as an absent key or an empty list, no pins as absent or {}, depending on the
    # program that made them: neither is a change.
    assert trust_roots.changes(IDENTITY, {"connection": CONNECTION}, {"connection": {**CONNECTION, "jump": []}}) == []
    assert trust_roots.changes(AGENT, {**AGENT_INPUTS, "release_ca": None}, {**AGENT_INPUTS, "release_ca": ""}) == []


def test_a_resource_that_stops_reaching_the_node_changes_no_host_key():
    pinned = {"connection": {**CONNECTION, "jump": [{"address": "deploy@bastion", "host_key": KEY_A}]}}
    assert trust_roots.changes(CERTIFICATE, pinned, {"connection": None}) == []  # keyOrigin: operator
    assert trust_roots.changes(CERTIFICATE, {"connection": None}, pinned) == []
    assert trust_roots.changes(CERTIFICATE, pinned, {"connection": UNKNOWN}) == [
        Change("hostKey", FP_B, NOT_KNOWN), Change("ssh.jump", f"bastion (key {FP_A})", NOT_KNOWN)]


def test_signer_arguments_are_fingerprinted_not_shown():
    old = {"signer": {"kind": "command", "command": ["/opt/sign", "--profile", "node"]}}
    new = {"signer": {"kind": "command", "command": ["/opt/sign", "--profile", "root-ca"]}}
    (change,) = trust_roots.changes(CERTIFICATE, old, new)
    assert change.setting == "signer.command" and change.old != change.new
    assert change.new.startswith("/opt/sign (+2 arguments, argv sha256:") and "root-ca" not in change.new


# --------------------------------------------------------------------------- the rule


def test_the_rule_fails_each_change_unless_the_policy_config_approves_its_new_value():
    kind, old, new, change = CASES["signing key swapped"]
    (message,) = rules.trust_roots_unchanged(kind, old, new, {})
    assert message.startswith("gpu-01: agent.signingKey") and FP_A in message and FP_C in message
    assert json.dumps({"setting": "agent.signingKey", "to": FP_C}) in message  # the fix: the entry to add
    allow = {"allowed": [{"setting": "agent.signingKey", "to": FP_C}]}
    assert rules.trust_roots_unchanged(kind, old, new, allow) == []
    for wrong in ({"setting": "agent.signingKey", "to": FP_A}, {"setting": "hostKey", "to": FP_C},
                  {"to": FP_C}, "agent.signingKey"):
        assert rules.trust_roots_unchanged(kind, old, new, {"allowed": [wrong]}) != [], wrong


def test_the_rule_judges_every_trust_root_and_names_none_of_a_created_resource():
    for kind, old, new, change in CASES.values():
        messages = rules.trust_roots_unchanged(kind, old, new, {})
        assert len(messages) == 1 and change.setting in messages[0], messages
        assert rules.trust_roots_unchanged(kind, old, new, {"allowed": [
            {"setting": change.setting, "to": change.new}]}) == []
    assert rules.trust_roots_unchanged(AGENT, None, AGENT_INPUTS, {}) == []


def test_the_rule_is_mandatory_and_in_the_pack():
    assert rules.TRUST_ROOTS_UNCHANGED in rules.RULES
    assert rules.TRUST_ROOTS_UNCHANGED.enforcement == "mandatory"


# --------------------------------------------------------------------------- a CA the preview could not read

def pki_dir_with(tmp_path: Path, pem: str | None) -> str:
    pki = tmp_path / "pki"
    pki.mkdir(exist_ok=True)
    if pem is not None:
        (pki / "ca.pem").write_text(pem)
    elif (pki / "ca.pem").exists():
        (pki / "ca.pem").unlink()
    return str(pki)


def judged_here(old: dict[str, Any], new: dict[str, Any], allowed: list[Any] | None = None) -> list[str]:
    """What the policy pack judges for a ClientCertificate: its new inputs with pkiDir's CA as read on this
    machine (as llmgw_pulumi.policy does), against the recorded ones."""
    ca_pem = Path(new["pki_dir"], "ca.pem")
    read = trust_roots.pem_sha256(ca_pem.read_text()) if ca_pem.exists() else None
    return rules.trust_roots_unchanged(CERTIFICATE, old, trust_roots.ca_as_read(new, read),
                                             {"allowed": allowed or []})


def test_a_pki_dir_ca_the_preview_cannot_read_is_judged_not_known_never_unchanged(tmp_path: Path) -> None:
    # check() keeps the recorded fingerprint where it cannot read ca.pem: the new inputs look unchanged.
    old = {**CERT_INPUTS, "pki_dir": pki_dir_with(tmp_path, None)}
    carried = copy.deepcopy(old)
    assert trust_roots.changes(CERTIFICATE, old, carried) == []  # what the inputs alone would say
    (message,) = judged_here(old, carried)
    assert message.startswith("gpu-01: ca changes from " + CA_1[1]) and NOT_KNOWN in message
    assert "make it known" in message  # the fix
    # No allowed entry approves a value nobody has seen, not even one naming it as shown.
    assert judged_here(old, carried, [{"setting": "ca", "to": NOT_KNOWN}]) != []


def test_a_pki_dir_ca_read_here_is_judged_by_its_fingerprint(tmp_path: Path) -> None:
    old = {**CERT_INPUTS, "pki_dir": pki_dir_with(tmp_path, CA_1[0])}
    assert judged_here(old, copy.deepcopy(old)) == []  # the same CA: nothing to judge
    pki_dir_with(tmp_path, CA_2[0])  # the pull request's ca.pem, where the preview reads it
    (message,) = judged_here(old, copy.deepcopy(old))
    assert CA_1[1] in message and CA_2[1] in message
    assert judged_here(old, copy.deepcopy(old), [{"setting": "ca", "to": CA_2[1]}]) == []


def summary_judged_here(data: dict[str, Any], *flags: str) -> dict[str, tuple[str, str]]:
    """The summary's table, by `python -m llmgw_pulumi.preview.cli` on this machine."""
    out = io.StringIO()
    assert cli.main([*flags], stdin=io.StringIO(json.dumps(data)), stdout=out) == 0
    return table_rows(out.getvalue())


def test_the_summary_shows_a_pki_dir_ca_the_preview_cannot_read_as_not_known(tmp_path: Path) -> None:
    data = preview()
    cert = step(data, "ClientCertificate", "node12")
    pki = pki_dir_with(tmp_path, None)
    for state in ("oldState", "newState"):  # check() kept the recorded fingerprint: the inputs look unchanged
        cert[state]["inputs"].update({"pki_dir": pki, "ca_fingerprint": CA_1[1].removeprefix("sha256:")})
    unread = f"trust root ca changed: {CA_1[1]} → {NOT_KNOWN}"
    assert summary_judged_here(data, "--ca-read-here")[unread] == ("1", "node12")
    assert not any(row.startswith("trust root ca") for row in summary_judged_here(data))  # a JSON read elsewhere
    pki_dir_with(tmp_path, CA_1[0])
    assert not any(row.startswith("trust root ca") for row in summary_judged_here(data, "--ca-read-here"))
    pki_dir_with(tmp_path, CA_2[0])
    assert summary_judged_here(data, "--ca-read-here")[f"trust root ca changed: {CA_1[1]} → {CA_2[1]}"] == (
        "1", "node12")


def test_the_ci_preview_script_asks_the_summary_to_read_the_ca_here() -> None:
    script = (Path(__file__).resolve().parents[2] / "examples" / "ci" / "preview.sh").read_text()
    (command,) = [line for line in script.splitlines() if line.startswith("python3 -m llmgw_pulumi.preview.cli")]
    assert "--ca-read-here" in command


def test_a_ca_given_as_signer_ca_is_taken_from_the_inputs_not_from_pki_dir() -> None:
    signed = {**CERT_INPUTS, "signer": {"kind": "caKey", "ca_pem": CA_1[0]}}
    assert trust_roots.ca_as_read(signed, None) == signed
    for signer in (None, {"kind": "pkiDir"}, {"timeout_seconds": 60}):
        inputs = {**CERT_INPUTS, "signer": signer}
        assert trust_roots.ca_as_read(inputs, None)["ca_fingerprint"] == UNKNOWN, signer
        assert trust_roots.ca_as_read(inputs, "ab" * 32)["ca_fingerprint"] == "ab" * 32, signer


def test_no_allowed_entry_approves_a_change_to_a_value_not_known() -> None:
    old = {**CERT_INPUTS, "signer": {"kind": "command", "command": ["/opt/sign"], "ca_pem": CA_1[0]}}
    new = {**old, "signer": UNKNOWN}
    messages = rules.trust_roots_unchanged(CERTIFICATE, old, new, {"allowed": [
        {"setting": s, "to": NOT_KNOWN} for s in trust_roots.SETTINGS]})
    assert {m.split(" changes from ")[0] for m in messages} == {"gpu-01: signer.kind", "gpu-01: signer.command"}
    assert all("make it known" in m and '"to": ' not in m for m in messages)  # no entry offered to add
    assert not trust_roots.approved(Change("hostKey", FP_B, NOT_KNOWN), [{"setting": "hostKey", "to": NOT_KNOWN}])
    assert trust_roots.approved(Change("hostKey", FP_B, FP_C), [{"setting": "hostKey", "to": FP_C}])


# --------------------------------------------------------------------------- the summary


def changed_preview(**agent_inputs: Any) -> dict[str, Any]:
    """The fixture's preview with node10's and node11's AgentInstall updates changing ``agent_inputs``, and
    node12's certificate update moving to another signer program."""
    data = preview()
    for node in ("node10", "node11"):
        agent = step(data, "AgentInstall", node)
        agent["oldState"]["inputs"]["signing_key"] = KEY_A
        agent["newState"]["inputs"].update(agent_inputs)
    cert = step(data, "ClientCertificate", "node12")
    cert["oldState"]["inputs"]["signer"] = {"kind": "command", "command": ["/opt/sign"]}
    cert["newState"]["inputs"]["signer"] = {"kind": "command", "command": ["/tmp/x/sign"]}
    return data


def table_rows(summary: str) -> dict[str, tuple[str, str]]:
    """The summary's table as the CommonMark parser reads it: first cell's text -> (count, ids' text)."""
    rows, cells, inside = {}, [], False
    for t in PARSER.parse(summary):
        if t.type == "tr_open":
            cells, inside = [], True
        elif t.type == "inline" and inside:
            cells.append("".join(c.content for c in t.children or []))
        elif t.type == "tr_close":
            inside = False
            if len(cells) == 3:
                rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_each_change_is_a_row_of_its_own_with_old_new_and_the_nodes_folded():
    fleet = cli.review(changed_preview(signing_key=KEY_C), NOW)
    assert fleet.nodes["node10"].trust_roots == (Change("agent.signingKey", FP_A, FP_C),)
    assert fleet.nodes["node12"].trust_roots == (Change("signer.command", "/opt/sign", "/tmp/x/sign"),)
    assert fleet.nodes["node14"].trust_roots == ()
    rows = table_rows(cli.markdown(fleet))
    assert rows[f"trust root agent.signingKey changed: {FP_A} → {FP_C}"] == ("2", "node10, node11")
    assert rows["trust root signer.command changed: /opt/sign → /tmp/x/sign"] == ("1", "node12")
    assert rows["untouched"] == ("1", "node14")  # nothing on a node changes: the row says what does


def test_a_trust_root_change_alone_is_shown_though_every_node_is_untouched():
    data = preview()
    # node14 is only refreshed in the fixture: a `--show-sames` preview lists its resources as "same" steps.
    refreshed = [s for s in data["steps"] if s["op"] == "refresh" and s["urn"].endswith("::node14")]
    for s in refreshed:
        same = copy.deepcopy(s)
        same["op"] = "same"
        if s["urn"].endswith("NodeIdentity::node14"):
            same["newState"]["inputs"]["connection"]["host_key"] = KEY_C
        data["steps"].append(same)
    summary = cli.markdown(cli.review(data, NOW))
    assert table_rows(summary)[f"trust root hostKey changed: {NOT_SET} → {FP_C}"] == ("1", "node14")


def test_a_node_onboarded_or_removed_has_no_trust_root_row():
    data = preview()
    data["steps"] += created(data, "node15", connection={"host_key": KEY_C}, agent={"signing_key": KEY_C})
    for s in data["steps"]:
        if s["op"] == "delete" and s["urn"].endswith("::node13"):
            s["oldState"].setdefault("inputs", {})["signing_key"] = KEY_A
    fleet = cli.review(data, NOW)
    assert fleet.nodes["node15"].onboarded and fleet.nodes["node13"].removed  # the positive control
    assert fleet.nodes["node15"].trust_roots == () and fleet.nodes["node13"].trust_roots == ()
    assert "trust root" not in cli.markdown(fleet)


def test_many_nodes_are_folded_in_one_row():
    data = preview()
    node10 = [s for s in data["steps"] if s["urn"].endswith("AgentInstall::node10") and s["op"] == "update"][0]
    for i in range(1, 41):
        s = copy.deepcopy(node10)
        s["urn"] = s["urn"].replace("::node10", f"::gpu-{i:03d}")
        s["oldState"]["inputs"]["release_ca"] = "/etc/ssl/release-ca.pem"
        data["steps"].append(s)
    rows = table_rows(cli.markdown(cli.review(data, NOW)))
    assert rows[f"trust root agent.releaseCa changed: /etc/ssl/release-ca.pem → {NOT_SET}"] == ("40", "gpu-001..040")


HOSTILE = ["/opt/[pwn](https://evil.example)/sign", "/opt/pwn|x|y/sign", "/opt/`pwn` @team #12 <b>pwn</b>/sign",
           "/opt/pwn\n| forged | 1 | row |"]


@pytest.mark.parametrize("path", HOSTILE)
def test_a_shown_value_is_inert_in_the_summary(path):
    # The positive control: the path as live Markdown makes a link, a table break, a mention or HTML.
    data = changed_preview()
    step(data, "ClientCertificate", "node12")["newState"]["inputs"]["signer"]["command"] = [path]
    summary = cli.markdown(cli.review(data, NOW))
    assert_marker_only_in_code(summary)
    shown = [t.content for t in leaves(PARSER.parse(summary)) if t.type == "code_inline" and "pwn" in t.content]
    assert shown == [path.replace("\n", "\\n")], shown
    assert len(table_rows(summary)) == len([line for line in summary.splitlines() if line.startswith("| ")])


def test_release_roots_a_refresh_did_not_record_are_not_judged_but_an_opt_out_is():
    # A refresh that finds the agent drifted records inputs rebuilt from its outputs, which keep no release inputs.
    rebuilt = {k: v for k, v in AGENT_INPUTS.items() if k not in BinarySource.RELEASE_FIELDS}
    assert not trust_roots.release_recorded(rebuilt)
    assert trust_roots.changes(AGENT, rebuilt, AGENT_INPUTS) == []
    # A node installed under the opt-out records that: a key added later is a change to judge.
    opted_out = {**rebuilt, "verification": "opt-out"}
    assert [c.setting for c in trust_roots.changes(AGENT, opted_out, AGENT_INPUTS)] == ["agent.signingKey"]
    # The other trust roots of the same resource are judged as before.
    moved = {**AGENT_INPUTS, "release_url": "https://other.example/llmgw"}
    assert [c.setting for c in trust_roots.changes(AGENT, rebuilt, moved)] == ["agent.releaseUrl"]
