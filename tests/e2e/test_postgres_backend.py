"""State in PostgreSQL, as a team keeps it: two operators' checkouts log in with `pulumi login postgres://...`
(Debian's server, lab/postgres.py, over TLS) and share one stack: its lock refuses a second `up` while one
runs, and either operator refreshes and destroys what the other made."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from lab.postgres import Postgres
from lab.stack import LabStack, engine_env
from tests.conftest import REPO, resource_count, stack_config, state_urns, wait_until
from tests.e2e.conftest import POSTGRES_STACK


def checkout(work: Path, cluster: Any, server: Postgres, committed: Path | None = None) -> LabStack:
    """An operator's machine: their own PULUMI_HOME, logged in to the PostgreSQL backend with `pulumi login`, and
    their own checkout of the project (with the stack's settings file as committed, when there is one)."""
    env = engine_env(cluster.engine_bin, work / "pulumi-home", work / "no-file-backend")
    del env["PULUMI_BACKEND_URL"]
    env.update(server.client_env(), SSL_CERT_FILE=str(cluster.pki_dir / "ca.pem"))
    subprocess.run(["pulumi", "login", server.url, "--non-interactive"], env=env, check=True, capture_output=True)
    if committed is not None:
        (work / "checkout" / "stacks").mkdir(parents=True)
        shutil.copy2(committed, work / "checkout" / "stacks" / committed.name)
    return LabStack(work / "checkout", POSTGRES_STACK, env, REPO)


def test_two_checkouts_share_a_stack_in_postgres_its_lock_refuses_a_second_up_and_either_refreshes_and_destroys(
        cluster, hosts, postgres, tmp_path):
    first, second = hosts(2)
    alice = checkout(tmp_path / "alice", cluster, postgres)
    alice.set_config(stack_config(cluster, [first]))
    bob = checkout(tmp_path / "bob", cluster, postgres, committed=alice.config_path)

    who = bob.cli("whoami", "--verbose").stdout
    assert f"Backend URL: {postgres.url}" in who, who
    assert postgres.password not in who

    made = alice.up()
    assert made.ok, made.output
    assert cluster.control_plane.wait_for({first.hostname}, timeout=30)
    assert [k for k in postgres.keys("%/.pulumi/stacks/%") if k.endswith(f"/{POSTGRES_STACK}.json")], postgres.keys("%")
    # Bob sees Alice's state: nothing to change from his checkout.
    seen = bob.preview(expect_no_changes=True)
    assert seen.ok and set(seen.changes) == {"same"}, seen.output
    assert state_urns(bob) == state_urns(alice) and len(state_urns(bob)) == resource_count([first.hostname]) - 1

    # Alice onboards a second node; while her `up` holds the stack's lock, Bob's is refused and changes nothing.
    alice.set_config(stack_config(cluster, [first, second]))
    runs: list[Any] = []
    hers = threading.Thread(target=lambda: runs.append(alice.up()))
    hers.start()
    try:
        assert wait_until(lambda: bool(postgres.keys("%/.pulumi/locks/%")), timeout=60), "Alice's up took no lock"
        refused = bob.up()
    finally:
        hers.join()
    assert not refused.ok
    assert "the stack is currently locked by 1 lock(s)" in refused.output, refused.output
    assert refused.changes == {}
    assert runs[0].ok, runs[0].output
    assert postgres.keys("%/.pulumi/locks/%") == []
    both = [first.hostname, second.hostname]
    assert len(state_urns(alice)) == resource_count(both) - 1  # but the stack's own

    # Bob pulls Alice's committed config, refreshes and destroys both nodes; Alice's checkout sees the same state.
    shutil.copy2(alice.config_path, bob.config_path)
    refreshed = bob.refresh()
    assert refreshed.ok and set(refreshed.changes) == {"same"}, refreshed.output
    gone = bob.destroy()
    assert gone.ok and gone.changes.get("delete") == resource_count(both), gone.output
    assert state_urns(alice) == [] and state_urns(bob) == []
    assert not cluster.control_plane.connected() & set(both)
