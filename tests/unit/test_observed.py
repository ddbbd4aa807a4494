"""The one shape of what a node was seen holding, the one comparison, and the migrations from earlier shapes."""

from __future__ import annotations

import pytest

from llmgw_pulumi.nodestate import desired, observed
from llmgw_pulumi.nodestate.observed import Observed, Seen, Want, Wanted

A, B = "a" * 64, "b" * 64
A_SHORT, B_SHORT = "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqo", "u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7u7s"
"""A and B as state keeps a digest from version 2: unpadded base64url (base64 of 32 bytes 0xaa, 0xbb)."""
CONFIG, KEY, BINARY = desired.CONFIG_PATH, desired.KEY_PATH, desired.BINARY_PATH


def test_a_file_is_recorded_as_sha256_mode_and_owner() -> None:
    seen = Observed({CONFIG: Seen(A, 0o644, "root:root"), KEY: None, BINARY: Seen(B, 0o755, "root:root", reads_as=A)},
                    "active enabled")
    record = seen.record()
    assert record == {"files": {"binary": f"{B_SHORT} 755 root:root = {A_SHORT}", "config": f"{A_SHORT} 644 root:root",
                                "key": "absent"}, "unit": "active enabled"}
    assert Observed.parse(record) == seen


def test_a_short_digest_reads_back_as_the_hex_one_and_a_record_in_hex_does_not_parse() -> None:
    assert (observed.short(A), observed.hex_of(A_SHORT), observed.hex_of(A)) == (A_SHORT, A, A)
    assert Seen.parse(f"{A} 644 root:root") is None, "a version 1 file record is read only through its migration"
    assert Seen.parse(f"{A_SHORT[:-1]} 644 root:root") is None
    assert observed.digest_hex(f"sha256:{B_SHORT}") == B and observed.digest_hex(B_SHORT) is None
    assert observed.digest_hex("server: cp:7443\n") is None


DIFFERENCES = [
    ("as wanted", Seen(A, 0o644, "root:root"), []),
    ("says the same in other words", Seen(B, 0o644, "root:root", reads_as=A), []),
    ("other bytes", Seen(B, 0o644, "root:root"), [f"{CONFIG}: sha256 {B[:12]}..., not {A[:12]}..."]),
    ("mode", Seen(A, 0o600, "root:root"), [f"{CONFIG}: mode 0600, not 0644"]),
    ("owner", Seen(A, 0o644, "nobody:nogroup"), [f"{CONFIG}: owner nobody:nogroup, not root:root"]),
    ("absent", None, [f"{CONFIG}: absent"]),
]


@pytest.mark.parametrize("situation,seen,expected", DIFFERENCES, ids=[d[0] for d in DIFFERENCES])
def test_differences(situation: str, seen: Seen | None, expected: list[str]) -> None:
    wanted = Wanted({CONFIG: Want(A, 0o644, "root:root")})
    assert [str(d) for d in observed.differences(wanted, Observed({CONFIG: seen}))] == expected, situation


def test_a_key_made_on_the_node_only_has_to_be_there_with_its_mode() -> None:
    wanted = Wanted({KEY: Want(observed.ANY, 0o600, "root:root")})
    assert observed.differences(wanted, Observed({KEY: Seen(B, 0o600, "root:root")})) == []
    assert [d.what for d in observed.differences(wanted, Observed({KEY: Seen(B, 0o640, "root:root")}))] == ["mode"]
    assert [d.what for d in observed.differences(wanted, Observed({KEY: None}))] == ["absent"]


def test_the_units_state_and_a_node_never_seen() -> None:
    wanted = Wanted({CONFIG: Want(A, 0o644, "root:root")}, "active enabled")
    stopped = Observed({CONFIG: Seen(A, 0o644, "root:root")}, "inactive disabled")
    assert [str(d) for d in observed.differences(wanted, stopped)] == ["unit: state inactive disabled, not active enabled"]
    # No observation says nothing is known of the node: everything differs, so it is read before any change.
    assert [d.what for d in observed.differences(wanted, None)] == ["absent", "state"]


def test_the_preview_shows_drift_by_path() -> None:
    wanted = Wanted({CONFIG: Want(A, 0o644, "root:root")})
    found = observed.differences(wanted, Observed({CONFIG: Seen(A, 0o600, "nobody:root")}))
    assert observed.by_path(found) == {CONFIG: "mode 0600, not 0644; owner nobody:root, not root:root"}


# --------------------------------------------------------------------------- migrations

IDENTITY_V0 = {  # NodeIdentity's outputs as ca1dd75 and e80e071 wrote them
    "node_id": "gpu-01", "host_key": "ssh-ed25519 AAAA", "hostname": "gpu-01", "trust": "updated",
    "files": {"/etc/llmgw/ca.pem": A, "/etc/llmgw/agent.pem": B,
              "/etc/llmgw/agent-key.pem": f"{A}; mode 0644, not 0600; owner nobody:nogroup, not root:root",
              "/usr/local/share/ca-certificates/llmgw-ca.crt": "absent"},
}
AGENT_V0 = {  # AgentInstall's outputs as ca1dd75 and e80e071 wrote them
    "node_id": "gpu-01", "installed_sha256": A, "arch": "amd64", "agent_yaml": "server: cp:7443\n",
    "node_state": {"binary_sha256": f"{A}; mode 0777, not 0755", "config_sha256": B, "unit_sha256": "absent",
                   "active": "inactive", "enabled": "enabled"},
}


IDENTITY_V1 = {  # what the step from version 0 makes of IDENTITY_V0: version 1's record, by path with hex digests
    **{k: v for k, v in IDENTITY_V0.items() if k != "files"},
    "observed": {"files": {"/etc/llmgw/agent-key.pem": f"{A} 644 nobody:nogroup", "/etc/llmgw/agent.pem": f"{B} 644 root:root",
                           "/etc/llmgw/ca.pem": f"{A} 644 root:root",
                           "/usr/local/share/ca-certificates/llmgw-ca.crt": "absent"}},
}
UNIT_TEXT = "[Unit]\n"
UNIT_SHORT = "rmxjz_M7z6O2otbQyd0ZUh3tqjURRrGmQtK_yc9aHh8"
"""sha256 of UNIT_TEXT, short."""
YAML_SHORT = "A4G7thWMuDAc1liP2pXo2R1DaZE5PEr5gOicAQoHSjU"
"""sha256 of AGENT_V0's agent_yaml, short."""
AGENT_V1 = {  # AgentInstall's outputs as fc02334 wrote them (state_version 1): the texts kept, the record by path
    **{k: v for k, v in AGENT_V0.items() if k != "node_state"}, "unit": UNIT_TEXT, "state_version": 1,
    "observed": {"files": {BINARY: f"{A} 777 root:root", CONFIG: f"{B} 644 root:root = {A}", desired.UNIT_PATH: "absent"},
                 "unit": "inactive enabled"},
}


def test_identity_v0_files_become_the_version_1_record() -> None:
    assert observed._v0_to_v1(dict(IDENTITY_V0), desired.IDENTITY) == IDENTITY_V1


def test_agent_v0_node_state_becomes_the_version_1_record() -> None:
    assert observed._v0_to_v1(dict(AGENT_V0), desired.AGENT) == {
        **{k: v for k, v in AGENT_V0.items() if k != "node_state"},
        "observed": {"files": {BINARY: f"{A} 777 root:root", CONFIG: f"{B} 644 root:root",
                               desired.UNIT_PATH: "absent"}, "unit": "inactive enabled"},
    }


def test_identity_v1_record_becomes_one_by_file_name_with_short_digests() -> None:
    assert observed.migrate({**IDENTITY_V1, "state_version": 1}, desired.IDENTITY) == {
        **{k: v for k, v in IDENTITY_V1.items() if k != "observed"},
        "observed": {"files": {"ca": f"{A_SHORT} 644 root:root", "cert": f"{B_SHORT} 644 root:root",
                               "key": f"{A_SHORT} 644 nobody:nogroup", "trust_anchor": "absent"}},
        "state_version": 3,
    }


def test_agent_v1_texts_become_their_digests_and_the_record_one_by_file_name() -> None:
    assert observed.migrate(AGENT_V1, desired.AGENT) == {
        **AGENT_V1, "agent_yaml": f"sha256:{YAML_SHORT}", "unit": f"sha256:{UNIT_SHORT}", "state_version": 3,
        "observed": {"files": {"binary": f"{A_SHORT} 777 root:root", "config": f"{B_SHORT} 644 root:root = {A_SHORT}",
                               "unit": "absent"}, "unit": "inactive enabled"},
    }


def test_version_0_is_brought_to_the_current_version_step_by_step() -> None:
    migrated = observed.migrate(IDENTITY_V0, desired.IDENTITY)
    assert migrated["state_version"] == 3 and migrated["observed"]["files"]["key"] == f"{A_SHORT} 644 nobody:nogroup"
    agent = observed.migrate(AGENT_V0, desired.AGENT)
    assert agent["agent_yaml"] == f"sha256:{YAML_SHORT}" and "node_state" not in agent
    assert agent["observed"]["files"]["binary"] == f"{A_SHORT} 777 root:root"


def test_a_current_record_is_left_as_it_is_and_migrating_twice_changes_nothing() -> None:
    once = observed.migrate(AGENT_V0, desired.AGENT)
    assert observed.migrate(once, desired.AGENT) == once
    later = {**once, "state_version": 99, "observed": {"something": "new"}}
    assert observed.migrate(later, desired.AGENT) == later, "a record of a later version is not rewritten"


def test_agent_v2_rollout_keeps_the_nodes_share_of_the_canary_list() -> None:
    """Version 2 gave every AgentInstall the stack's whole canary list; version 3 says whether it is a canary."""
    v2 = {**observed.migrate(AGENT_V1, desired.AGENT), "state_version": 2}
    stack_wide = {"max_parallel": 2, "canaries": ["gpu-00", v2["node_id"]], "directory": "/home/op/.local/state/x"}
    assert observed.migrate({**v2, "rollout": stack_wide}, desired.AGENT)["rollout"] == {
        "max_parallel": 2, "canary": True, "directory": "/home/op/.local/state/x"}
    others = {**stack_wide, "canaries": ["gpu-00"]}
    assert observed.migrate({**v2, "rollout": others}, desired.AGENT)["rollout"]["canary"] is False
    assert "rollout" not in observed.migrate(v2, desired.AGENT)  # no rollout: none made up
    identity = {**IDENTITY_V1, "state_version": 2, "rollout": stack_wide}  # only AgentInstall's is migrated
    assert observed.migrate(identity, desired.IDENTITY)["rollout"] == stack_wide
