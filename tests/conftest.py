"""Shared fixtures for the end-to-end tests: real hosts, the real engine, the llmgw test doubles.

Unit tests (tests/unit) need none of this; these fixtures are session-scoped
and built on first use, so `pytest tests/unit` stays instant.

- ``lab``: the test-host lab "t" on 10.250.0.0/24 (systemd-nspawn containers
  booting real systemd, each in its own netns). Torn down at the end, also
  after failures; leftovers of a killed run are swept at start.
- ``hosts``: boots fresh hosts (new indices, so nothing carries over) for one test.
- ``cluster``: the cluster CA, a control plane and a standby (in this process,
  on the bridge address), and a release server in its own netns publishing
  llmgw test-double releases; plus a local dev build of the double.
- ``new_stack``: a stack of this project (or of an example project) driven by
  the `pulumi` CLI, in a temp copy of the project directory with a local file
  backend and passphrase secrets.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import shutil
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest

CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))
REPO = Path(__file__).resolve().parent.parent
RELEASE = "v1.4.2"
NEXT_RELEASE = "v1.5.0"
TAMPERED_RELEASE = "v6.6.6"
DEV_VERSION = "v1.4.2-3-gdeadbee"


LAB_TIMEOUT = 900
"""Seconds a lab or end-to-end test may take before pytest-timeout fails it, the set-up of its fixtures included
(the first test of a process boots the lab's hosts): the slowest takes a few minutes on 2 busy cores.
Unit tests have pyproject.toml's `timeout`."""
PIP_TIMEOUT = 1800
"""Seconds for a test that installs packages into a fresh virtualenv (marker ``pip``)."""
SYSTEM_CAS = 3
"""How many of Debian's system CAs each test host trusts (lab.hosts.Lab.system_cas): every onboarding runs
update-ca-certificates, a few processes for each CA listed, and the suite onboards hundreds of nodes. What the
tests check of it, the cluster's root in the system bundle and gone from it after destroy, is the same with 3."""


SLOW_FIRST: dict[str, int] = {
    "tests/e2e/test_review.py::test_the_summary_of_a_real_preview_says_what_the_up_then_does": 238,
    "tests/e2e/test_review.py::test_on_7_nodes_the_summary_of_a_bump_under_rollout": 143,
    "tests/e2e/test_review.py::test_a_pull_request_that_changes_a_trust_root_shows_its_row_and_fails_unless_the_b": 143,
    "tests/e2e/test_review.py::test_every_policy_rule_fails_a_preview_warns_when_advisory_and_passes_a_compliant_": 104,
    "tests/e2e/test_languages.py::test_language_example_boots_onboards_reimages_and_destroys_in_order": 100,
    "tests/e2e/test_fleet.py::test_nodes_behind_one_bastion_are_onboarded_through_it": 60,
    "tests/e2e/test_faults.py::test_release_server_faults_during_an_upgrade_keep_the_running_agent": 80,
    "tests/e2e/test_ci_credentials.py::test_a_pull_request_s_job_previews_with_read_access_to_the_state_alone": 67,
    "tests/e2e/test_lifecycle.py::test_no_private_key_or_passphrase_in_state_or_output": 67,
    "tests/e2e/test_readiness.py::test_problems_appear_under_their_node_the_gate_fails_only_them_and_fixing_clear": 66,
    "tests/e2e/test_lifecycle.py::test_preview_on_a_reviewers_machine_without_ssh_key_or_ca_key": 63,
    "tests/e2e/test_signer.py::test_a_ci_runner_with_only_the_signer_takes_the_fleet_over_changing_nothing[script": 61,
    "tests/e2e/test_signer.py::test_a_ci_runner_with_only_the_signer_takes_the_fleet_over_changing_nothing[pulumi": 60,
    "tests/e2e/test_upgrade.py::test_an_upgrade_from_the_base_commit_changes_no_node[b870cc4]": 60,
    "tests/e2e/test_upgrade.py::test_an_upgrade_from_the_base_commit_changes_no_node[e80e071]": 59,
    "tests/e2e/test_upgrade.py::test_an_upgrade_from_the_base_commit_changes_no_node[fc02334]": 58,
    "tests/e2e/test_upgrade.py::test_an_upgrade_from_the_base_commit_changes_no_node[ca1dd75]": 57,
    "tests/e2e/test_lifecycle.py::test_a_replaced_vm_is_onboarded_and_the_old_one_let_go": 57,
    "tests/e2e/test_postgres_backend.py::test_two_checkouts_share_a_stack_in_postgres_its_lock_refuses_a_second_u": 56,
    "tests/e2e/test_rollout.py::test_onboarding_is_not_gated_and_a_version_bump_restarts_two_at_a_time_canary_fir": 56,
    "tests/e2e/test_lifecycle.py::test_refresh_shows_drift_and_up_repairs_exactly_that": 55,
    "tests/e2e/test_any_machine.py::test_two_operators_and_a_ci_runner_with_other_homes_see_no_change_and_a_real_": 54,
    "tests/e2e/test_registration.py::test_registration_is_checked_at_the_control_plane_and_a_refused_certificate_": 54,
    "tests/e2e/test_provider_processes.py::test_fewer_provider_processes_move_the_nodes_without_touching_one": 53,
    "tests/e2e/test_onboarding.py::test_three_nodes_onboard_with_one_up": 51,
    "tests/e2e/test_upgrade.py::test_an_upgrade_from_the_base_commit_changes_no_node[953c63e]": 49,
    "tests/e2e/test_node_key.py::test_a_node_without_openssl_is_told_the_fix_or_keeps_its_key_on_the_operator_sid": 48,
    "tests/e2e/test_lifecycle.py::test_new_node_id_on_the_same_host_replaces_without_losing_files": 48,
    "tests/e2e/test_signer.py::test_a_signer_that_fails_changes_nothing_on_the_node_and_the_next_up_recovers": 43,
    "tests/e2e/test_node_key.py::test_a_node_the_script_onboarded_is_taken_over_without_a_change": 43,
    "tests/e2e/test_lifecycle.py::test_preview_names_what_changes_and_updates_happen_in_place": 42,
    "tests/e2e/test_inventory.py::test_inventory_and_fleet_show_the_gpus_and_a_missing_hca": 42,
    "tests/e2e/test_faults.py::test_pulumi_up_interrupted_mid_deployment[SIGKILL-checkpoints-skipped]": 41,
    "tests/e2e/test_signer.py::test_onboarding_renewal_and_ca_rotation_through_the_hsm_signer": 40,
    "tests/e2e/test_faults.py::test_pulumi_up_interrupted_mid_deployment[SIGKILL]": 40,
    "tests/e2e/test_racks.py::test_racks_example_runs_one_stack_per_rack_with_shared_project_config_and_node_list": 37,
    "tests/e2e/test_lifecycle.py::test_a_node_gone_for_good_is_kept_by_refresh_and_let_go_when_removed_from_the_c": 37,
    "tests/e2e/test_faults.py::test_pulumi_up_interrupted_mid_deployment[SIGINT]": 37,
    "tests/e2e/test_smoke.py::test_up_preview_destroy_one_node": 37,
    "tests/e2e/test_rollout.py::test_a_release_that_fails_to_start_stops_after_the_canary": 37,
    "tests/e2e/test_trust_renewal.py::test_a_reimaged_machine_is_onboarded_afresh_once_declared": 36,
    "tests/e2e/test_release_trust.py::test_a_signed_release_is_fetched_once_per_up_and_previews_offline": 36,
    "tests/e2e/test_faults.py::test_a_change_killed_outright_is_undone_by_the_next_run": 36,
    "tests/e2e/test_faults.py::test_a_bad_ca_fails_before_anything_reaches_the_node": 35,
    "tests/e2e/test_lifecycle.py::test_destroy_removes_everything_and_leaves_engines_running": 35,
}
"""Known slow tests (node id prefix: rough seconds of the call on 2 cores, measured with --durations), run first: pytest-xdist hands tests
out in collection order, so a long test collected last would run alone at the end while the other processes idle.
A test not listed keeps its place after them; a stale number only costs time, never a test."""


def slow_first_weight(item: pytest.Item) -> int:
    return max((s for prefix, s in SLOW_FIRST.items() if item.nodeid.startswith(prefix)), default=0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (SLOW_FIRST); the larger timeouts above, for each test that does not set its own
    (``@pytest.mark.timeout``)."""
    items.sort(key=slow_first_weight, reverse=True)  # stable: the others keep their order
    for item in items:
        if item.get_closest_marker("timeout"):
            continue
        if item.get_closest_marker("pip"):
            item.add_marker(pytest.mark.timeout(PIP_TIMEOUT))
        elif item.get_closest_marker("hosts") or item.get_closest_marker("engine") or \
                {"e2e", "lab"} & set(item.path.relative_to(REPO / "tests").parts[:1]):
            item.add_marker(pytest.mark.timeout(LAB_TIMEOUT))


def lab_name_and_subnet(worker: str) -> tuple[str, str]:
    """This test process's lab: LLMGW_TEST_LAB=name:subnet (default t:10.250.0), so two test runs can share
    a machine; under pytest-xdist each worker N gets its own lab, the name with a letter for N appended and
    the subnet's second octet lowered by N (gw1 of t:10.250.0: tb on 10.249.0)."""
    name, _, subnet = os.environ.get("LLMGW_TEST_LAB", "t:10.250.0").partition(":")
    if not worker.startswith("gw"):
        return name, subnet
    n = int(worker[2:])
    first, second, third = subnet.split(".")
    return f"{name}{chr(ord('a') + n)}", f"{first}.{int(second) - n}.{third}"


@pytest.fixture(scope="session")
def lab(request: pytest.FixtureRequest) -> Iterator[Any]:
    from lab.hosts import Lab

    worker = getattr(request.config, "workerinput", {}).get("workerid", "")
    name, subnet = lab_name_and_subnet(worker)
    lab = Lab(name=name, subnet=subnet, workdir=CACHE / f"lab-{name}", system_cas=SYSTEM_CAS)
    shutil.rmtree(lab.hosts_dir, ignore_errors=True)
    lab.setup()
    try:
        yield lab
    finally:
        lab.teardown()


_indices = itertools.count(10)
_indices_lock = threading.Lock()


@pytest.fixture
def hosts(lab: Any) -> Iterator[Callable[..., list[Any]]]:
    """``hosts(n, hostnames=None, start=True, segment="main")`` -> fresh hosts; all are stopped when the test ends.

    ``segment``: "private" puts the hosts on the lab's private segment, which the
    tests' own namespace cannot reach; "both" makes bastions with a leg on each.
    """
    made: list[Any] = []

    def boot(n: int, hostnames: list[str] | None = None, start: bool = True, segment: str = "main") -> list[Any]:
        with _indices_lock:
            indices = [next(_indices) for _ in range(n)]
        batch = [lab.prepare(i, hostname=(hostnames[k] if hostnames else None), segment=segment)
                 for k, i in enumerate(indices)]
        made.extend(batch)
        if start:
            with ThreadPoolExecutor(max_workers=min(16, n)) as pool:
                list(pool.map(lambda h: h.start(), batch))
        return batch

    yield boot
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda h: h.stop(), made))


@dataclass
class Cluster:
    pki_dir: Path
    control_plane: Any
    standby: Any
    release_url: str
    release_root: Path
    dev_binary: Path
    engine_bin: Path
    ssh_key_path: Path
    release_signing_key: str = ""
    """The public line of the key every release the cluster publishes is signed with (``agent.signingKey``)."""
    release_signing_key_path: Path | None = None
    """Its private key, made at run time, for tests that publish releases of their own."""


@pytest.fixture(scope="session")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from lab import pki as labpki
    from lab.control_plane import ControlPlane
    from lab.doubles.llmgw import build_llmgw
    from lab.release_server import make_signing_key, publish_release
    from lab.stack import engine_bin

    work = tmp_path_factory.mktemp("cluster")
    signing_key, signing_public = make_signing_key(work / "release-signing")
    pki_dir = work / "pki"
    labpki.init_ca(pki_dir)

    primary = ControlPlane(pki_dir, lab.gateway).start()
    standby = ControlPlane(pki_dir, lab.gateway, standby=True).start()

    root = work / "releases"
    publish_release(root, RELEASE, {"amd64": build_llmgw(RELEASE), "arm64": b"not for this node"}, sign_with=signing_key)
    publish_release(root, NEXT_RELEASE, {"amd64": build_llmgw(NEXT_RELEASE)}, sign_with=signing_key)
    publish_release(root, TAMPERED_RELEASE, {"amd64": build_llmgw(TAMPERED_RELEASE)},
                    tamper={"amd64": build_llmgw(TAMPERED_RELEASE) + b"\n# tampered\n"}, sign_with=signing_key)
    release_addr = f"{lab.subnet}.2"
    cert, key = labpki.issue_server_cert(pki_dir, work / "release-tls", "releases", ips=[release_addr], dns=[])
    proc = lab.run_in_netns(
        [sys.executable, "-m", "lab.release_server", "--root", str(root), "--bind", release_addr,
         "--port", "8443", "--cert", str(cert), "--key", str(key)],
        netns_suffix="repo", addr_index=2, cwd=str(REPO), stdout=__import__("subprocess").PIPE,
    )
    assert proc.stdout is not None
    assert b"listening" in proc.stdout.readline(), "release server did not start"

    dev = work / "dev" / "llmgw"
    dev.parent.mkdir()
    dev.write_bytes(build_llmgw(DEV_VERSION))
    dev.chmod(0o755)

    yield Cluster(pki_dir, primary, standby, f"https://{release_addr}:8443", root, dev, engine_bin(), lab.ssh_key_path,
                  signing_public, signing_key)
    primary.stop()
    standby.stop()


@pytest.fixture
def new_stack(cluster: Cluster, tmp_path: Path) -> Callable[..., Any]:
    """``new_stack(config, name, project)`` -> a stack of ``project`` (default: this repository) driven by the
    `pulumi` CLI in a temp copy of the project directory, its config written to stacks/Pulumi.<name>.yaml."""
    from lab.stack import LabStack, engine_env

    made: list[Any] = []

    def make(config: dict[str, Any], name: str = "test", project: Path = REPO) -> Any:
        env = engine_env(cluster.engine_bin, tmp_path / "pulumi-home", tmp_path / "state")
        # The operator's side fetches each release's checksums.txt over https: it trusts the lab's release server
        # (its certificate is the cluster CA's) the way an operator's shell would, through OpenSSL's SSL_CERT_FILE.
        env["SSL_CERT_FILE"] = str(cluster.pki_dir / "ca.pem")
        stack = LabStack(tmp_path / f"project-{len(made)}", name, env, project)
        stack.set_config(config)
        made.append(stack)
        return stack

    return make


def stack_config(cluster: Cluster, hosts: list[Any], *, ids: list[str] | None = None,
                 nodes: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    """A stack config onboarding ``hosts`` from the test release, signed with the cluster's release key (node ids =
    hostnames unless given)."""
    entries = nodes or [{"id": (ids[i] if ids else h.hostname), "address": h.addr} for i, h in enumerate(hosts)]
    config: dict[str, Any] = {
        "pkiDir": str(cluster.pki_dir),
        "servers": [cluster.control_plane.address],
        "agent": {"version": RELEASE, "releaseUrl": cluster.release_url, "signingKey": cluster.release_signing_key},
        "ssh": {"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 30},
        "nodes": entries,
    }
    config.update(top)
    return config


def ssh(host: Any, cluster: Cluster, command: str, user: str = "deploy") -> tuple[int, str]:
    """Run a command on a test host the way an operator would check it: over SSH."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host.addr, username=user, key_filename=str(cluster.ssh_key_path), timeout=10,
                   allow_agent=False, look_for_keys=False)
    try:
        _, out, err = client.exec_command(command, timeout=60)
        rc = out.channel.recv_exit_status()
        return rc, out.read().decode() + err.read().decode()
    finally:
        client.close()


def up_when(stack: Any, ready: Callable[[list[dict[str, Any]], float], bool], action: Callable[..., Any],
            *args: Any) -> Any:
    """`pulumi up`, with ``action(*args)`` run (in a thread) as soon as ``ready(events so far, seconds since the up
    began)`` holds: at the moment the test means (a wait under way), not after a guess of seconds that a loaded
    machine can overrun (the up would then reach the node after the action, and wait for nothing). The up's Run; the
    test fails if that moment never came."""
    events: list[dict[str, Any]] = []
    over = threading.Event()
    acted = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        while not over.is_set():
            if ready(list(events), time.monotonic() - start):
                acted.set()
                action(*args)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = stack.up(on_event=events.append)
    finally:
        over.set()
        watcher.join()
    assert acted.is_set(), f"the moment to act never came during the up:\n{run.output}"
    return run


def said(events: list[dict[str, Any]], text: str) -> bool:
    """Whether one of the engine's diagnostic events so far says ``text`` (for ``up_when``)."""
    return any(text in e["diagnosticEvent"].get("message", "") for e in events if "diagnosticEvent" in e)


def extract_tar(data: bytes, into: Path) -> None:
    """Extract a tar archive of this repository (``git archive``) into ``into``: with tarfile's "data" filter where
    Python has it (3.11.4 and later; the package allows 3.11.0, and the venv may be Debian's 3.11.2)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def resource_count(node_ids: list[str]) -> int:
    """Resources the program registers: the stack, one provider process per shard in use, five per node.

    The shard of a node is its contract, stated here independently of the
    package: sha256 of the node id, as a big-endian number, modulo the shard
    count (1 by default: every node in one provider process).
    """
    return 1 + len({shard(n) for n in node_ids}) + 5 * len(node_ids)


def state_urns(stack: Any) -> list[str]:
    """The URNs in a stack's state but the stack's own (which a program that fails before registering still records)."""
    return [r["urn"] for r in stack.export().get("resources") or [] if r["type"] != "pulumi:pulumi:Stack"]


SPREAD = 8
"""A shard count (LLMGW_PROVIDER_SHARDS) for tests of nodes in several provider processes."""


def shard(node_id: str, shards: int = 1) -> int:
    """The provider shard a node id is spread to with ``shards`` shards (see resource_count)."""
    return int.from_bytes(hashlib.sha256(node_id.encode()).digest(), "big") % shards
