"""The benchmark's pure pieces: the growth exponent, toxiproxy's API payloads, the targets and the summary.

The benchmark itself prints figures and is never a pass/fail test; these check
the arithmetic and the text it is built from.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench import growth, output_lines, toxiproxy
from bench.summary import WIDTH, Target, summary

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))

# --------------------------------------------------------------------------- growth exponent


@pytest.mark.parametrize("k", [0.0, 0.5, 1.0, 2.0])
def test_the_exponent_of_a_power_law_is_its_power(k):
    points = [(n, 3.0 * n**k) for n in (1, 10, 30, 100, 200)]
    assert growth.exponent(points) == pytest.approx(k, abs=1e-9)


def test_the_exponent_is_a_least_squares_fit():
    # In units of log 2: x = 0, 1, 3 and y = 0, 2, 3; the least-squares slope is 13/14 by hand, the end-to-end one 1.
    points = [(1, 1.0), (2, 4.0), (8, 8.0)]
    assert growth.exponent(points) == pytest.approx(13 / 14)
    # Two points: the slope between them.
    assert growth.exponent([(30, 4.0), (100, 10.0)]) == pytest.approx(math.log(2.5) / math.log(100 / 30))


def test_no_exponent_without_two_sizes_or_with_a_zero():
    assert growth.exponent([(30, 4.0)]) is None
    assert growth.exponent([(30, 4.0), (30, 5.0)]) is None
    assert growth.exponent([(10, 0.0), (30, 1.0)]) is None


def test_the_large_fleet_fit_starts_at_30_nodes():
    # Flat up to 10 nodes (fixed costs), quadratic from 30 on.
    points = [(1, 900.0), (10, 900.0), (30, 900.0), (100, 900.0 * (100 / 30) ** 2), (200, 900.0 * (200 / 30) ** 2)]
    g = growth.growth(points)
    assert g.large == pytest.approx(2.0)
    assert g.overall is not None and g.overall < 1.5
    assert g.superlinear()
    assert not growth.growth([(30, 1.0), (100, 3.0)]).superlinear()
    # 30 nodes is in the window: without it, 100 -> 200 alone would be exactly linear.
    window = growth.growth([(10, 1.0), (30, 1.0), (100, 4.0), (200, 8.0)])
    assert window.large is not None and window.large > 1.05
    assert "k=2.00 (30+)" in g.label()


@pytest.fixture(scope="module")
def plotting_python() -> str:
    """A Python that has matplotlib (a benchmark-only extra): this one when the benchmark's tools are installed,
    else a venv with bench/requirements.txt, pinned as scripts/bench-tools.sh installs it, made once and kept in
    the cache (keyed by the pins; made aside and renamed into place, so that test runs side by side share it)."""
    if importlib.util.find_spec("matplotlib") is not None:
        return sys.executable
    pins = (REPO / "constraints.txt").read_bytes() + (REPO / "bench" / "requirements.txt").read_bytes()
    venv = CACHE / f"plotting-venv-{hashlib.sha256(pins).hexdigest()[:16]}"
    if not (venv / "bin" / "python").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=CACHE))
        env = {**os.environ, "PIP_CACHE_DIR": str(CACHE / "pip"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        try:
            for cmd in ([sys.executable, "-m", "venv", str(aside)],
                        [str(aside / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints.txt"),
                         "-r", str(REPO / "bench" / "requirements.txt")]):
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            # A venv's scripts name its directory: made aside, it is used through its own python, by path.
            os.rename(aside, venv)
        except OSError:
            if not (venv / "bin" / "python").exists():
                raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    return str(venv / "bin" / "python")


PLOT = """
import sys
from pathlib import Path
from bench import growth
fig = growth.Figure("wall", "wall time", "s", {"pulumi preview": [(1, 1.0), (30, 4.0), (100, 9.0)]})
print(growth.plot(fig, Path(sys.argv[1])))
"""


@pytest.mark.pip
def test_plot_writes_a_png(tmp_path, plotting_python):
    done = subprocess.run([plotting_python, "-c", PLOT, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path == tmp_path / "benchmark-wall.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- toxiproxy payloads


def test_a_proxy_listens_on_loopback_and_forwards_to_the_hosts_sshd():
    assert toxiproxy.proxy_payload("node7", "10.254.0.27") == {
        "name": "node7", "listen": "127.0.0.1:0", "upstream": "10.254.0.27:22", "enabled": True}
    assert toxiproxy.proxy_payload("n", "h", 2222, 40000)["listen"] == "127.0.0.1:40000"
    assert toxiproxy.proxy_payload("n", "h", 2222)["upstream"] == "h:2222"
    with pytest.raises(ValueError):
        toxiproxy.proxy_payload("a/b", "h")


def test_latency_is_added_on_both_directions():
    toxics = toxiproxy.latency_toxics(25)
    assert sorted(t["stream"] for t in toxics) == ["downstream", "upstream"]
    assert {t["name"] for t in toxics} == set(toxiproxy.LATENCY_TOXICS)
    for t in toxics:
        assert t["type"] == "latency"
        assert t["toxicity"] == 1.0
        assert t["attributes"] == {"latency": 25, "jitter": 0}
    with pytest.raises(ValueError):
        toxiproxy.latency_toxics(-1)


def test_the_listen_port_is_read_from_the_answer_and_must_be_loopback():
    assert toxiproxy.listen_port({"name": "n", "listen": "127.0.0.1:40123"}) == 40123
    with pytest.raises(RuntimeError, match="not on loopback"):
        toxiproxy.listen_port({"name": "n", "listen": "0.0.0.0:40123"})


# --------------------------------------------------------------------------- targets and summary


def test_a_target_is_met_on_the_right_side_of_its_limit():
    assert Target("up / floor", 1.25, 1.25).met is True
    assert Target("up / floor", 1.26, 1.25).met is False
    assert Target("script / up", 2.5, 2.5, at_least=True).met is True
    assert Target("script / up", 2.4, 2.5, at_least=True).met is False
    assert Target("x", None, 1.0).met is None


def test_the_summary_has_one_line_per_target_and_fits_a_screen():
    targets = [Target("30 nodes: pulumi up / floor", 1.56, 1.25, measured="32.3 s / 20.7 s"),
               Target("30 nodes, 50 ms: parallel script / up", 2.9, 2.5, at_least=True),
               Target("100 nodes: preview, s", None, 10.0),
               Target("a very long target name " * 5, 0.5, 1.0, measured="x" * 200)]
    text = summary(targets, notes=["note one"])
    lines = text.splitlines()
    assert len(lines) == 1 + len(targets) + 1 + 1 + 1  # the last target's "from what" has a line of its own
    assert all(len(line) <= WIDTH for line in lines)
    assert "MISSED" in lines[1] and "32.3 s / 20.7 s" in lines[1] and "<= 1.25" in lines[1]
    assert "met" in lines[2] and ">= 2.5" in lines[2]
    assert "not measured" in lines[3] and "n/a" in lines[3]
    assert lines[4].endswith("met") and "x" not in lines[4]
    assert lines[5] == "    " + "x" * (WIDTH - 5) + "~"
    assert lines[-2] == "-- 2 met, 1 missed, 1 not measured"
    assert lines[-1] == "note one"
    # An exponent just above its limit is shown with the digits that make it so.
    assert "  1.004     <= 1  MISSED" in summary([Target("growth exponent", 1.0043, 1.0, digits=3)])
    # A "from what" that fits beside its target stays on its line.
    wide = summary([Target("n" * 40, 0.5, 1.0, measured="engine 47 + provider 216")], name_width=67)
    assert wide.splitlines()[1].endswith("met          engine 47 + provider 216")


# --------------------------------------------------------------------------- routing and hosts


def test_ssh_config_sends_each_host_address_to_its_proxy():
    from bench.onboard import proxy_host_blocks

    assert proxy_host_blocks({}) == ""
    text = proxy_host_blocks({"10.254.0.22": 40002, "10.254.0.21": 40001})
    assert text == ("Host 10.254.0.21\n  HostName 127.0.0.1\n  Port 40001\n  HostKeyAlias 10.254.0.21\n"
                    "Host 10.254.0.22\n  HostName 127.0.0.1\n  Port 40002\n  HostKeyAlias 10.254.0.22\n"
                    "Host *\n")  # what follows (the system config's Include) applies to every host again


def test_the_targets_are_ratios_of_the_runs_of_one_bench():
    from bench.onboard import FLOOR, PAR, SEQ, UP, Counters, Result, issue12_targets

    def run(size: int, kind: str, wall: float, delay: int = 0, ssh: int = 0, engine: float = 0.0) -> Result:
        return Result(size, kind, True, wall, ssh, Counters(wall, 0, 0, 0, engine, 0, 0), 0, 0, delay_ms=delay,
                      kind=kind)

    results = [run(30, UP, 30.0, ssh=30, engine=6.0), run(30, FLOOR, 20.0),
               run(30, UP, 40.0, delay=50), run(30, PAR, 120.0, delay=50), run(30, SEQ, 300.0, delay=50),
               run(100, UP, 90.0, ssh=100)]
    by_name = {t.name: t for t in issue12_targets(results)}
    assert by_name["30 nodes: pulumi up / floor"].value == pytest.approx(1.5)
    assert by_name["30 nodes: pulumi up / floor"].met is False
    assert by_name["30 nodes, +50 ms: script parallel / up"].value == pytest.approx(3.0)
    assert by_name["30 nodes, +50 ms: script sequential / up"].value == pytest.approx(7.5)
    assert by_name["30 nodes: operator CPU-s per node (up)"].value == pytest.approx(0.2)
    assert by_name["100 nodes: SSH connections per node per up"].value == pytest.approx(1.0)
    assert by_name["100 nodes: no-op up, s"].value is None  # not measured: neither met nor missed
    assert by_name["100 nodes: no-op up, s"].met is None
    assert by_name["30->100 nodes: no-op up growth exponent"].digits == 3  # 1.004 shows as such beside MISSED


def test_up_over_floor_takes_an_up_on_hosts_with_the_full_ca_bundle():
    from bench.onboard import FLOOR, UP, Counters, Result, issue12_targets

    def run(kind: str, wall: float, reduced_ca: bool = False) -> Result:
        return Result(30, kind, True, wall, 30, Counters(wall, 0, 0, 0), 0, 0, kind=kind, reduced_ca=reduced_ca)

    # A scale run at 30 nodes on hosts with a reduced bundle comes first; the floor's hosts have the full one.
    targets = issue12_targets([run(UP, 10.0, reduced_ca=True), run(UP, 30.0), run(FLOOR, 20.0)])
    assert targets[0].name == "30 nodes: pulumi up / floor"
    assert targets[0].value == pytest.approx(1.5)


def test_the_signer_comparison_puts_the_two_ups_side_by_side_with_the_hsms_over_pki_dirs():
    from bench.onboard import SIGNED_UP, Counters, Result, signer_comparison

    def up(signer: str, wall: float, engine: float, mean: float, span: tuple[float, float], alone: float) -> Result:
        steps = {"ClientCertificate create": {"count": 30, "mean_s": mean, "max_s": mean,
                                              "first_start_s": span[0], "last_end_s": span[1]}}
        kind = f"{SIGNED_UP} {signer}"
        return Result(30, kind, True, wall, 30, Counters(wall, 0, 0, 0, engine, 0, 0), 0, 0, kind=kind,
                      detail={"steps": steps, "signing_alone_s": alone})

    table = signer_comparison([up("pkiDir", 30.0, 4.0, 1.0, (2.0, 8.0), 0.001),
                               up("HSM", 45.0, 5.0, 1.5, (2.0, 11.0), 0.03)])
    rows = {cells[1]: cells[2:] for cells in (line.split(" | ") for line in table.splitlines()[2:])}
    assert rows["`pulumi up` wall, s"] == ["30.00", "45.00", "1.50 |"]
    assert rows["CPU-s operator's side (engine + program + provider)"] == ["4.0", "5.0", "1.25 |"]
    assert rows["ClientCertificate steps, first start to last end / N, s per certificate"] == ["0.200", "0.300",
                                                                                                "1.50 |"]
    assert rows["signing step alone, s per certificate (30 one after another, with the check)"] == [
        "0.0010", "0.0300", "30.00 |"]
    # One signer's up missing: its column and the ratio say so rather than a number.
    missing = signer_comparison([up("pkiDir", 30.0, 4.0, 1.0, (2.0, 8.0), 0.001)])
    assert "| 30 | `pulumi up` wall, s | 30.00 | n/a | n/a |" in missing
    assert signer_comparison([]) == "(not measured)"


# --------------------------------------------------------------------------- issue 21: backend bytes, daily changes


def test_wal_positions_subtract_as_64_bit_numbers():
    from bench.backend import wal_bytes

    assert wal_bytes("0/10", "0/30") == 0x20
    assert wal_bytes("0/FFFFFFF0", "1/10") == 0x20  # across the low word's wrap
    assert wal_bytes("16/B374D848", "16/B374D848") == 0


def test_the_watch_counts_every_version_written_under_the_backend_once(tmp_path):
    from bench.fswatch import WriteWatch

    root = tmp_path / "state"
    (root / "events").mkdir(parents=True)
    (root / ".pulumi" / "stacks").mkdir(parents=True)
    (root / ".pulumi" / "stacks" / "old.json").write_bytes(b"x" * 50)  # there before: not written during the run
    with WriteWatch(root, skip=("events",)) as watch:
        stacks = root / ".pulumi" / "stacks"
        for size in (1000, 1200):  # written to a temporary file, then renamed into place, as the engine saves
            tmp = stacks / "tmp-1234"
            tmp.write_bytes(b"c" * size)
            tmp.rename(stacks / "s.json")
        (stacks / "s.json.attrs").write_bytes(b"a" * 30)
        history = root / ".pulumi" / "history" / "s"
        history.mkdir(parents=True)  # a new directory: watched from now on
        (history / "s-1.checkpoint.json").write_bytes(b"h" * 400)
        (root / "events" / "events-0.jsonl").write_bytes(b"e" * 9999)  # the bench's event log: left out
        subprocess.run(["sync"], check=True)  # a command between the writes and the end: nothing else
    assert not watch.overflowed
    # Each version at its own size, though the second replaced the first before the watch read either.
    assert watch.bytes == 1000 + 1200 + 30 + 400
    assert watch.versions == 4


def test_the_backend_names_stacks_per_run_unless_emptied_and_hides_its_password():
    from bench.backend import Backend

    file = Backend("file:///var/cache/x/state")
    assert file.is_file and file.kind == "file" and file.stack_name("bench-n30", "20261201-1200") == "bench-n30"
    assert file.position() is None and file.root == Path("/var/cache/x/state")
    pg = Backend("postgres://bench:s3cret@127.0.0.1:5432/state")
    assert not pg.is_file and pg.kind == "postgres"
    assert pg.stack_name("bench-n30", "20261201-1200") == "bench-n30-20261201-1200"
    assert pg.shown == "postgres://bench:***@127.0.0.1:5432/state" and "s3cret" not in pg.shown
    assert Backend("postgres://bench@db/state").shown == "postgres://bench@db/state"


def test_the_daily_changes_are_1_percent_and_10_nodes_at_most_half_the_fleet():
    from bench import daily

    assert [daily.upgraded_count(n) for n in (1, 10, 30, 200, 500, 1000)] == [1, 1, 1, 2, 5, 10]
    assert [daily.changed_count(n) for n in (1, 10, 30, 1000)] == [1, 5, 10, 10]


def test_nodes_split_round_robin_over_the_stacks():
    from bench.daily import split

    assert split(list(range(10)), 4) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert split([1, 2], 1) == [[1, 2]]
    for parts in (0, 3):
        with pytest.raises(ValueError, match="give 1 to 2 stacks"):
            split([1, 2], parts)


def test_a_daily_change_the_engine_did_not_make_is_a_failed_run():
    from bench.daily import ADD, REMOVE, UPGRADE, check_changes
    from bench.onboard import Counters, Result

    def run(kind: str, changes: dict[str, int]) -> Result:
        return Result(30, kind, True, 1.0, 0, Counters(1.0, 0, 0, 0), 0, 0, kind=kind, detail={"changes": changes})

    done = [run(UPGRADE, {"update": 1, "same": 119}), run(ADD, {"create": 40}), run(REMOVE, {"delete": 40})]
    for r in done:
        check_changes(r)
        assert r.ok, r.note
    missed = run(UPGRADE, {"same": 120})
    check_changes(missed)
    assert not missed.ok and "expected update steps" in missed.note


def test_stacks_run_at_once_add_up_to_one_run():
    from bench.daily import merged

    ok, detail = merged([{"changes": {"create": 8}, "remote_ops": 6, "engine_run": True},
                         {"changes": {"create": 4, "same": 1}, "remote_ops": 3, "engine_run": True,
                          "note": "FAILED (see log)"}], [True, False])
    assert not ok
    assert detail["changes"] == {"create": 12, "same": 1}
    assert (detail["remote_ops"], detail["engine_run"], detail["note"]) == (9, True, "FAILED (see log)")
    assert merged([{"changes": {}}], [True])[0]


def test_the_backend_table_shows_the_checkpoint_traffic_over_the_state():
    from bench.onboard import Counters, Result
    from bench.report import backend_table

    measured = Result(30, "daily: nodes added", True, 12.0, 0, Counters(12.0, 0, 0, 0, 3.0, 1.5, 0.5), 0, 0,
                      backend_bytes=5_000_000, state_bytes=500_000)
    baseline = Result(30, "baseline script, parallel", True, 50.0, 30, Counters(50.0, 0, 0, 0), 0, 0)
    assert backend_table([baseline]) == "(no engine runs measured)"
    rows = backend_table([baseline, measured]).splitlines()
    assert len(rows) == 3
    assert rows[2].split(" | ")[3:11] == ["12.00", "3.0", "1.5", "0.5", "0.167", "500", "5.00", "10.0"]


def test_a_hosts_memory_is_the_pss_of_the_processes_in_its_cgroup_subtree(tmp_path):
    from bench.measure import host_memory

    # A process holding 48 MiB it has written (so its pages are its own), then waiting; a cgroup-like tree of files.
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = b'x' * (48 * 2**20); print('ready', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        (tmp_path / "cgroup.procs").write_text(f"{child.pid}\n")
        (tmp_path / "cgroup.threads").write_text(f"{child.pid}\n")
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "cgroup.procs").write_text("")
        (tmp_path / "sub" / "cgroup.threads").write_text("1\n2\n")
        mib, tasks = host_memory(tmp_path)
        assert 48 <= mib < 200
        assert tasks == 3
    finally:
        child.kill()
        child.wait()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert host_memory(empty) == (0.0, 0)


def test_the_machine_holds_as_many_hosts_as_memory_and_pids_allow(monkeypatch):
    from bench import measure

    monkeypatch.setattr(measure, "mem_available_mib", lambda: 10_000.0)
    assert measure.host_capacity(10.0, 0) == min(850, measure_pid_max() // 20)
    assert measure.host_capacity(10.0, 100) == min(935, measure_pid_max() // 20)  # the running hosts' memory back
    assert measure.host_capacity(0.0, 0) == int(10_000 * 0.85 / measure.ASSUMED_HOST_MIB)  # none measured yet
    assert measure.host_capacity(1.0, 0, tasks=1000) == measure_pid_max() // 2000


def measure_pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def test_the_lab_postgres_backend_names_its_added_round_trip_and_needs_lab_postgres(monkeypatch, tmp_path):
    import importlib.util

    from bench import backend

    assert backend.lab_postgres_rtt("lab-postgres") == 0
    assert backend.lab_postgres_rtt("lab-postgres:10") == 10
    for bad in ("lab-postgres:3", "lab-postgres:ten"):
        with pytest.raises(ValueError, match="even milliseconds"):
            backend.lab_postgres_rtt(bad)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="needs lab/postgres.py"):
        backend.start_lab_postgres("lab-postgres:10", tmp_path, lambda: None)


def test_a_failed_runs_multi_line_note_stays_in_its_table_row() -> None:
    from bench.measure import Counters, Result
    from bench.report import backend_table, table

    note = "FAILED (see up.log): Diagnostics:\n    error: reset | by peer\n\nResources:\n    1 errored"
    failed = Result(1000, "pulumi up, from scratch", False, 10.0, 5, Counters(10.0, 0, 0, 0), 0, 0, note=note,
                    kind="up", backend_bytes=1, state_bytes=1)
    for text in (table([failed]), backend_table([failed])):
        rows = [line for line in text.splitlines() if line.startswith("| 1000 ")]
        assert len(rows) == 1 and "error: reset / by peer Resources: 1 errored" in rows[0]
        assert all(line.startswith("|") for line in text.strip().splitlines())  # no line outside the table


def test_the_checkpoint_comparison_sets_each_skipped_run_beside_the_same_run_just_before_it():
    from bench.config import CHECKPOINTS_SKIPPED, NOOP, UP
    from bench.measure import Counters, Result
    from bench.targets import checkpoint_comparison

    def run(kind: str, wall: float, engine: float, written: int, size: int = 200) -> Result:
        return Result(size, kind, True, wall, size, Counters(wall, 0, 0, 0, engine, 20.0, 10.0), 0, 0, kind=kind,
                      backend_bytes=written)

    assert checkpoint_comparison([run(UP, 300.0, 150.0, 8_000_000_000)]) == "(not measured: --checkpoint-sizes not given)"
    results = [run(UP, 999.0, 999.0, 1, size=100), run(UP, 300.0, 150.0, 8_000_000_000), run(NOOP, 20.0, 9.0, 16_000_000),
               run(UP + CHECKPOINTS_SKIPPED, 200.0, 15.0, 4_000_000), run(NOOP + CHECKPOINTS_SKIPPED, 18.0, 9.0, 4_000_000)]
    rows = checkpoint_comparison(results).splitlines()[2:]
    assert rows[:3] == [
        "| 200 | pulumi up, from scratch | written | 300.00 | 150.0 | 20.0 | 10.0 | 0.900 | 8,000.00 | 1.00 |",
        "| 200 | pulumi up, from scratch | skipped | 200.00 | 15.0 | 20.0 | 10.0 | 0.225 | 4.00 | 1.00 |",
        "| 200 | pulumi up, from scratch | skipped / written | 0.67 | 0.10 | 1.00 | 1.00 | 0.25 | 0.00 | |",
    ]
    assert rows[5] == "| 200 | pulumi up, no-op | skipped / written | 0.90 | 1.00 | 1.00 | 1.00 | 1.00 | 0.25 | |"
    assert len(rows) == 6  # the 100-node run has no skipped one beside it


def test_state_size_says_which_bytes_the_engine_the_sdk_and_this_package_decide():
    from bench.measure import state_size

    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
    resource = {"urn": "urn:pulumi:s::p::t::n", "type": "pulumi-python:dynamic/llmgw:X",
                "inputs": {"__provider": "PICKLE", "node_id": "n"},
                "outputs": {"__provider": "PICKLE", "cert_pem": pem}}
    s = state_size({"resources": [resource]}, 1)
    # Each entry as the JSON text holds it, with the ", " after it.
    assert s.by_owner_no_pem["engine"] == len('"urn": "urn:pulumi:s::p::t::n", ') + len(
        '"type": "pulumi-python:dynamic/llmgw:X", ')
    assert s.by_owner_no_pem["sdk"] == 2 * len('"__provider": "PICKLE", ')
    # The rest is the package's (the PEM body left out), and the three add up to the resource.
    assert sum(s.by_owner_no_pem.values()) == s.total_no_pem - len('{"resources": []}')
    assert s.by_owner_no_pem["package"] > 0


class _ScriptedBench:
    """Just what Bench.pulumi_runs calls, each engine run's outcome taken from a script (the benchmark's wiring)."""

    def __init__(self, outcomes: list[bool]) -> None:
        self.outcomes, self.scenarios = list(outcomes), []
        self.shards, self.stack_tag, self.delay_ms = 0, "", 0

    def new_stack(self, name, extra_env=None):
        from types import SimpleNamespace
        return SimpleNamespace(set_config=lambda config: None, export_raw=lambda: '{"deployment": {"resources": []}}')

    def stack_config(self, nodes):
        return {}

    def engine_run(self, stack, verb, log_name):
        return self.outcomes.pop(0), {}

    def measure(self, size, scenario, hosts, action, agents=False):
        from types import SimpleNamespace
        ok, _ = action()
        self.scenarios.append(scenario)
        return SimpleNamespace(ok=ok, state=None, state_bytes=None)

    def weigh_hosts(self, hosts, state):
        pass

    def repeated(self, size, scenario, hosts, run):
        self.scenarios.append(scenario)
        return None

    def record_state(self, result, stacks):
        pass


@pytest.mark.parametrize(("outcomes", "runs", "onboarded"), [
    ([True, True], ["pulumi up, from scratch", "pulumi up, no-op"], True),
    ([False, True, True], ["pulumi up, from scratch", "pulumi up, again after a failed one", "pulumi up, no-op"], True),
    ([False, False, False], ["pulumi up, from scratch"] + ["pulumi up, again after a failed one"] * 2, False),
])
def test_a_failed_scale_up_is_run_again_at_most_twice_each_its_own_row(outcomes, runs, onboarded):
    from bench.config import RESUMES
    from bench.scenarios import Bench

    bench = _ScriptedBench(outcomes)
    stack = Bench.pulumi_runs(bench, 3, [], then=("noop",), resumes=RESUMES)  # type: ignore[arg-type]
    assert bench.scenarios == runs
    assert (stack is not None) is onboarded


def test_other_parts_do_not_run_a_failed_up_again():
    from bench.scenarios import Bench

    bench = _ScriptedBench([False, True])
    assert Bench.pulumi_runs(bench, 3, [], then=("noop",)) is None  # type: ignore[arg-type]
    assert bench.scenarios == ["pulumi up, from scratch"]


def test_the_page_says_which_runs_hosts_trusted_3_cas_as_the_results_record_it(tmp_path):
    from bench.harness import Harness
    from bench.onboard import UP, Counters, Result
    from bench.page import reduced_ca_line

    def run(reduced_ca: bool) -> Result:
        return Result(1000, UP, True, 1.0, 1000, Counters(1.0, 0, 0, 0), 0, 0, kind=UP, reduced_ca=reduced_ca)

    def line(flag: bool, *reduced: bool) -> str:
        return reduced_ca_line(Harness(sizes=[], repeats=1, log_dir=tmp_path, reduced_ca=flag,
                                       results=[run(r) for r in reduced]))

    # The flag given, but every run on full-bundle hosts (the provider-process part before it honoured the flag).
    assert line(True, False, False) == ("Every host keeps Debian's full CA bundle (--reduced-ca was given, "
                                        "but no part of this run uses it).")
    assert line(False, False) == "Every host keeps Debian's full CA bundle (no --reduced-ca)."
    assert line(True, True, False, False).endswith("the other 2 run(s) use the full bundle.")
    assert line(True, True, True).endswith("no run used the full bundle.")
    assert line(True, True).startswith("The hosts of the runs marked `hosts trust 3 system CAs (--reduced-ca)`")


FAILED_UP = """Updating (lines30):
 +  pulumi:pulumi:Stack llmgw-lines30 creating (0s)
Diagnostics:
  pulumi-python:dynamic/llmgw:ClientCertificate (node10):
    error: Traceback (most recent call last):
      File "/venv/pulumi/dynamic/__main__.py", line 84, in wrapper
    llmgw_pulumi.errors.WaitExpired: node10: cannot reach deploy@10.200.0.30 over ssh after 5s

Resources:
    2 errored
"""


def test_output_lines_counts_every_line_the_tracebacks_and_the_diagnostics():
    assert output_lines.counts(FAILED_UP) == {"lines": 10, "traceback_lines": 2, "diagnostics_lines": 8,
                                              "approval_lines": 0, "fetch_lines": 0}
    assert output_lines.counts("Updating (x):\nResources:\n") == {"lines": 2, "traceback_lines": 0,
                                                                  "diagnostics_lines": 0, "approval_lines": 0,
                                                                  "fetch_lines": 0}
    row = {"label": "after", "nodes": 30, **{run: output_lines.counts(FAILED_UP) for run in ("up", "no-op up", "failed up")}}
    assert output_lines.table([row]).splitlines()[2:] == [f"| after | 30 | {run} | 10 | 2 | 8 | 0 | 0 |"
                                                          for run in ("up", "no-op up", "failed up")]


FETCHES = "node10: the node fetches llmgw v1.4.2 from https://r:8443 and verifies it against the sha256 approved on this machine"
APPROVED = "llmgw v1.4.2: the sha256 of amd64 approved from checksums.txt signed by SHA256:x"
UP = f"""Updating (lines30):
    pulumi:pulumi:Stack llmgw-lines30  {APPROVED}
 +  pulumi:pulumi:Stack llmgw-lines30 creating (0s) {APPROVED}
 +  pulumi-python:dynamic/llmgw:AgentInstall node10 creating (0s) {FETCHES}
 +  pulumi-python:dynamic/llmgw:AgentInstall node10 created (4s) {FETCHES}
Diagnostics:
  pulumi-python:dynamic/llmgw:AgentInstall (node10):
    {FETCHES}

  pulumi:pulumi:Stack (llmgw-lines30):
    {APPROVED}
"""


def test_output_lines_counts_the_release_approval_and_each_nodes_fetch_line(tmp_path):
    assert output_lines.counts(UP) | {"lines": 0} == {"lines": 0, "traceback_lines": 0, "diagnostics_lines": 6,
                                                      "approval_lines": 3, "fetch_lines": 3}
    said_once = " +  pulumi:pulumi:Stack llmgw-lines30 creating (0s) llmgw v1.4.2 from https://r:8443: the sha256 of " \
                "amd64 approved pinned in agent.sha256\n"
    assert output_lines.counts(said_once)["approval_lines"] == 1
    # Rows measured before these were counted, counted again from the outputs the measurement kept.
    for run in output_lines.RUNS:
        output_lines.output_file(tmp_path, "before (abc)", 30, run).write_text(UP)
    old = {"lines": 1, "traceback_lines": 0, "diagnostics_lines": 0, "seconds": 9.5}
    (row,) = output_lines.recounted([{"label": "before (abc)", "nodes": 30, **dict.fromkeys(output_lines.RUNS, old)}],
                                    tmp_path)
    assert row["failed up"] == {**output_lines.counts(UP), "seconds": 9.5}


def test_the_critical_path_is_the_last_nodes_steps_and_the_waits_before_them(monkeypatch):
    """Two nodes; b's last step ends last: its path is its four steps, the waits before each, and the summary."""
    from bench import measure

    steps = measure.EngineSteps()
    steps.t0 = 100.0
    urn = "urn:pulumi:s::llmgw::llmgw:index:Node$pulumi-python:dynamic/llmgw:{}::{}"

    def at(t: float, kind: str, typ: str, node: str, op: str = "create") -> None:
        monkeypatch.setattr(measure.time, "monotonic", lambda: t)
        meta = {"urn": urn.format(typ, node), "type": f"pulumi-python:dynamic/llmgw:{typ}", "op": op}
        steps({kind: {"metadata": meta}})

    for node, offset in (("a", 0.0), ("b", 1.0)):
        t = 102.0 + offset
        for typ, took in (("ClientCertificate", 1.0), ("NodeIdentity", 4.0), ("AgentInstall", 3.0),
                          ("EngineCheck", 0.5)):
            at(t, "resourcePreEvent", typ, node)
            at(t + took, "resOutputsEvent", typ, node)
            t += took + 0.25
    monkeypatch.setattr(measure.time, "monotonic", lambda: 112.5)
    steps({"summaryEvent": {"resourceChanges": {"create": 8}}})
    for message in ("b: install-agent.sh took 2.500s on 10.0.0.2 (exit 0)",
                    "a: install-agent.sh took 1.500s on 10.0.0.1 (exit 0)",
                    "a: survey.sh took 0.100s on 10.0.0.1 (exit 0)", "a: the node fetches llmgw"):
        steps({"diagnosticEvent": {"message": message, "severity": "debug"}})

    assert steps.critical_path() == {
        "wait before ClientCertificate": 3.0, "ClientCertificate": 1.0,
        "wait before NodeIdentity": 0.25, "NodeIdentity": 4.0,
        "wait before AgentInstall": 0.25, "AgentInstall": 3.0,
        "wait before EngineCheck": 0.25, "EngineCheck": 0.5,
        "last step's end to the summary": 0.25}
    assert steps.script_seconds() == {"install-agent.sh": {"runs": 2, "mean_s": 2.0, "max_s": 2.5},
                                      "survey.sh": {"runs": 1, "mean_s": 0.1, "max_s": 0.1}}


def test_small_fleet_targets_say_met_or_missed_from_the_runs_figures():
    from bench import small_fleets

    def result(scenario: str, size: int, wall: float, delay: int = 0, ssh: int = 0, **cpu: float) -> dict:
        return {"scenario": scenario, "size": size, "wall": wall, "delay_ms": delay, "ok": True, "ssh": ssh,
                "cpu": {"engine": 0.0, "program": 0.0, "provider": 0.0, "hosts": 0.0, **cpu}, "detail": {}}

    run = {"results": [
        result(small_fleets.UP, 10, 12.0), result(small_fleets.SCRIPT_PARALLEL, 10, 15.0),
        result(f"{small_fleets.UP} (+50 ms RTT)", 10, 20.0, delay=50),
        result(f"{small_fleets.SCRIPT_PARALLEL} (+50 ms RTT)", 10, 19.0, delay=50),
        result(small_fleets.FLOOR, 10, 10.0),
        result(small_fleets.UP, 30, 40.0, engine=2.0, program=2.5, provider=3.0),
        result(small_fleets.SCRIPT_PARALLEL, 30, 50.0), result(small_fleets.FLOOR, 30, 31.0),
        result(small_fleets.NOOP, 30, 2.9), result(small_fleets.PREVIEW, 30, 3.1)]}
    rows = {line.split(" | ")[0].lstrip("| "): line for line in small_fleets.targets("x", run) if line.startswith("| ")}
    assert "| met |" in rows["10 nodes, plain bridge: `up` / script in parallel"]  # 12 < 15
    assert "**missed**" in rows["10 nodes, +50 ms RTT: `up` / script in parallel"]  # 20 > 19
    assert "| 1.20 |" in rows["10 nodes: `up` / floor"] and "| met |" in rows["10 nodes: `up` / floor"]
    assert "| 1.29 |" in rows["30 nodes: `up` / floor"] and "| met |" in rows["30 nodes: `up` / floor"]
    assert "| 0.250 |" in rows["30 nodes: operator CPU-s per node (`up`)"]  # 7.5 / 30: at the target, met
    assert "| met |" in rows["30 nodes: operator CPU-s per node (`up`)"]
    assert "| met |" in rows["30 nodes: up, no-op, s"] and "**missed**" in rows["30 nodes: preview, s"]


def test_scale_rows_are_the_sizes_every_run_measured():
    from bench import small_fleets

    def result(scenario: str, size: int) -> dict:
        return {"scenario": scenario, "size": size, "wall": 1.0, "ok": True, "stacks": 1, "delay_ms": 0,
                "cpu": {"engine": 1.0, "program": 2.0, "provider": 3.0}}

    before = {"results": [result("pulumi up, no-op", 200), result("daily: nodes added", 1000),
                          result("pulumi up, no-op", 30)]}
    after = {"results": [result("pulumi up, no-op", 200), result("daily: nodes added", 200)]}
    rows = small_fleets.scale([("before", before), ("after", after)])[2:]
    assert [r.split(" | ")[:3] for r in rows] == [["| before", "200", "pulumi up, no-op"],
                                                  ["| after", "200", "pulumi up, no-op"],
                                                  ["| after", "200", "daily: nodes added"]]
