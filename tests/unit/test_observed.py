"""The one shape of what a node was seen holding, the one comparison, and the migrations from earlier shapes."""

from __future__ import annotations

import pytest

from llmgw_pulumi import desired, observed
from llmgw_pulumi.observed import Observed, Seen, Want, Wanted

A, B = "a" * 64, "b" * 64
CONFIG, KEY, BINARY = desired.CONFIG_PATH, desired.KEY_PATH, desired.BINARY_PATH


def test_a_file_is_recorded_as_sha256_mode_and_owner() -> None:
    seen = Observed({CONFIG: Seen(A, 0o644, "root:root"), KEY: None, BINARY: Seen(B, 0o755, "root:root", reads_as=A)},
                    "active enabled")
    record = seen.record()
    assert record == {"files": {CONFIG: f"{A} 644 root:root", KEY: "absent", BINARY: f"{B} 755 root:root = {A}"},
                      "unit": "active enabled"}
    assert Observed.parse(record) == seen


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


def test_identity_v0_files_become_the_observed_record() -> None:
    migrated = observed.migrate(IDENTITY_V0, desired.IDENTITY)
    assert migrated == {
        **{k: v for k, v in IDENTITY_V0.items() if k != "files"},
        "observed": {"files": {"/etc/llmgw/agent-key.pem": f"{A} 644 nobody:nogroup", "/etc/llmgw/agent.pem": f"{B} 644 root:root",
                               "/etc/llmgw/ca.pem": f"{A} 644 root:root",
                               "/usr/local/share/ca-certificates/llmgw-ca.crt": "absent"}},
        "state_version": 1,
    }


def test_agent_v0_node_state_becomes_the_observed_record() -> None:
    migrated = observed.migrate(AGENT_V0, desired.AGENT)
    assert migrated == {
        **{k: v for k, v in AGENT_V0.items() if k != "node_state"},
        "observed": {"files": {BINARY: f"{A} 777 root:root", CONFIG: f"{B} 644 root:root",
                               desired.UNIT_PATH: "absent"}, "unit": "inactive enabled"},
        "state_version": 1,
    }


def test_a_current_record_is_left_as_it_is_and_migrating_twice_changes_nothing() -> None:
    once = observed.migrate(AGENT_V0, desired.AGENT)
    assert observed.migrate(once, desired.AGENT) == once
    later = {**once, "state_version": 99, "observed": {"something": "new"}}
    assert observed.migrate(later, desired.AGENT) == later, "a record of a later version is not rewritten"
