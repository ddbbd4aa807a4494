"""The rollout's coordination (llmgw_pulumi.rollout) across real processes, with real flock slots and files."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi import rollout
from llmgw_pulumi.config.specs import Rollout
from llmgw_pulumi.errors import ConfigError, RolloutStoppedError

WAIT = 30.0
"""The longest the tests wait for something that must happen: a regression fails after this, it does not hang."""


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(rollout.DIR_ENV, str(tmp_path / "rollout"))
    monkeypatch.setattr(rollout, "POLL", 0.02)
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    rollout.start_run(directory, ("c",))  # the run's canary list, as the program writes it from llmgw:rollout
    return directory


def plan(directory: Path, max_parallel: int | None = None, canaries: tuple[str, ...] = ()) -> Rollout:
    return Rollout(max_parallel=max_parallel, canaries=canaries, directory=str(directory))


def _say(log: str, node: str, what: str) -> None:
    """One line of the shared log; O_APPEND writes land in the order they happen, whichever process makes them."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{node}\t{what}\n".encode())
    finally:
        os.close(fd)


class _Clock:
    """The rollout's ``time`` in a child: says "waiting" the first time the gate makes its node wait (it polls)."""

    def __init__(self, log: str, node: str) -> None:
        self.log, self.node, self.waited = log, node, False

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if not self.waited:
            self.waited = True
            _say(self.log, self.node, "waiting")
        time.sleep(seconds)


def _update(directory: Path, max_parallel: int | None, canaries: tuple[str, ...], node: str, fail: bool,
            log: str, release: Any) -> None:
    """One provider process updating one node: inside the gate until the test lets it go; then how it ended."""
    rollout.POLL = 0.02
    rollout.time = _Clock(log, node)  # type: ignore[assignment]
    try:
        with rollout.update(plan(directory, max_parallel, canaries).for_node(node), node):
            _say(log, node, "inside")
            if not release.wait(WAIT):
                _say(log, node, "never let go")
            _say(log, node, "leaving")  # before the gate hears of it: a next node's "inside" comes after
            if fail:
                raise RuntimeError(f"{node}: the agent did not stay running")
        outcome = "done"
    except RolloutStoppedError as exc:
        outcome = "refused " + str(exc).replace("\n", " ")
    except RuntimeError:
        outcome = "failed"
    _say(log, node, outcome)


OUTCOMES = ("done", "failed", "refused")


class Updates:
    """Each node updated by a process of its own, all at once; the log says what each did, in order."""

    def __init__(self, directory: Path, tmp_path: Path, nodes: list[str], max_parallel: int | None = None,
                 canaries: tuple[str, ...] = (), failing: tuple[str, ...] = ()) -> None:
        self.log = tmp_path / "log"
        rollout.start_run(directory, canaries)  # a run of its own, listing its canaries
        ctx = multiprocessing.get_context("fork")
        self.release = {n: ctx.Event() for n in nodes}
        self.procs = [ctx.Process(target=_update, daemon=True,
                                  args=(directory, max_parallel, canaries, n, n in failing, str(self.log), self.release[n]))
                      for n in nodes]

    def __enter__(self) -> Updates:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *_: object) -> None:
        for p in self.procs:
            p.kill()
            p.join()

    def events(self) -> list[tuple[str, str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [(node, what) for node, what in (line.split("\t", 1) for line in lines)]

    def wait(self, until: Callable[[list[tuple[str, str]]], bool], what: str) -> list[tuple[str, str]]:
        deadline = time.monotonic() + WAIT
        while not until(events := self.events()):
            if time.monotonic() > deadline:
                pytest.fail(f"waited {WAIT:.0f}s for {what}; the log: {events}")
            time.sleep(0.02)
        return events

    def let_go(self) -> None:
        for event in self.release.values():
            event.set()

    def finish(self) -> dict[str, str]:
        """Let every node go and wait for each one's outcome: node -> outcome."""
        self.let_go()
        events = self.wait(lambda ev: len(outcomes(ev)) == len(self.procs), "every node's outcome")
        return outcomes(events)


def outcomes(events: list[tuple[str, str]]) -> dict[str, str]:
    return {n: w for n, w in events if w.startswith(OUTCOMES)}


def nodes_saying(events: list[tuple[str, str]], what: str) -> list[str]:
    return [n for n, w in events if w == what]


def most_inside(events: list[tuple[str, str]]) -> int:
    """The most nodes inside the gate at once, from the order of their "inside" and "leaving"."""
    now = most = 0
    for _, what in events:
        now += {"inside": 1, "leaving": -1}.get(what, 0)
        most = max(most, now)
    return most


def test_never_more_than_max_parallel_inside_the_gate_across_processes(stack, tmp_path):
    with Updates(stack, tmp_path, [f"n{i}" for i in range(6)], max_parallel=2) as updates:
        held = updates.wait(lambda ev: most_inside(ev) > 2 or (len(nodes_saying(ev, "inside")) == 2
                                                               and len(nodes_saying(ev, "waiting")) == 4),
                            "two nodes inside the gate and four waiting")
        assert most_inside(held) == 2 and len(nodes_saying(held, "waiting")) == 4, held
        assert set(updates.finish().values()) == {"done"}
    assert most_inside(updates.events()) == 2, updates.events()


def test_without_a_limit_all_update_at_once(stack, tmp_path):
    with Updates(stack, tmp_path, [f"n{i}" for i in range(4)]) as updates:
        updates.wait(lambda ev: most_inside(ev) == 4, "all four nodes inside the gate at once")
        assert set(updates.finish().values()) == {"done"}


def test_canaries_first_then_the_others(stack, tmp_path):
    others = ("a", "b", "d")
    with Updates(stack, tmp_path, ["c1", "c2", *others], max_parallel=3, canaries=("c1", "c2")) as updates:
        held = updates.wait(lambda ev: set(nodes_saying(ev, "inside")) >= {"c1", "c2"}
                            and set(nodes_saying(ev, "waiting")) >= set(others),
                            "both canaries inside the gate side by side, the others waiting")
        assert sorted(nodes_saying(held, "inside")) == ["c1", "c2"], held
        assert set(updates.finish().values()) == {"done"}
    events = updates.events()
    canaries_left = max(events.index((c, "leaving")) for c in ("c1", "c2"))
    assert min(events.index((n, "inside")) for n in others) > canaries_left, events


def test_a_failed_canary_stops_everyone_else_with_its_name(stack, tmp_path):
    with Updates(stack, tmp_path, ["c1", "a", "b"], max_parallel=2, canaries=("c1",), failing=("c1",)) as updates:
        updates.wait(lambda ev: "c1" in nodes_saying(ev, "inside") and {"a", "b"} <= set(nodes_saying(ev, "waiting")),
                     "the canary inside the gate, the others waiting for it")
        results = updates.finish()
    assert results["c1"] == "failed"
    for node in ("a", "b"):
        assert results[node].startswith(f"refused {node}: not updated: the rollout stopped because the update of "
                                        "c1 failed (c1: the agent did not stay running)"), results[node]
        assert "  fix: " in results[node], results[node]  # the RolloutStoppedError shows a fix
    assert nodes_saying(updates.events(), "inside") == ["c1"]


def test_after_a_failure_no_node_waiting_for_a_slot_starts(stack, tmp_path):
    nodes = ["a", "b", "c", "d"]
    with Updates(stack, tmp_path, nodes, max_parallel=1, failing=tuple(nodes)) as updates:
        held = updates.wait(lambda ev: len(nodes_saying(ev, "inside")) + len(nodes_saying(ev, "waiting")) >= 4,
                            "one node inside the gate, the other three waiting for its slot")
        assert len(nodes_saying(held, "inside")) == 1, held
        results = updates.finish()
    assert sorted(results.values()).count("failed") == 1, results
    assert sum(r.startswith("refused") for r in results.values()) == 3, results
    assert nodes_saying(updates.events(), "inside") == nodes_saying(held, "inside")


def test_a_canary_with_nothing_to_change_does_not_hold_the_others(stack):
    p = plan(stack, canaries=("c",))
    rollout.unchanged(p.for_node("c"), "c")
    with rollout.update(p.for_node("a"), "a"):
        pass
    assert rollout.Run.current(stack).state("a") == (rollout.DONE, "")


def test_a_node_waits_for_the_canaries_its_run_lists_not_for_its_own_input(stack, tmp_path):
    """The canary list is the run's (written by the program), so a node's input says only whether it is one."""
    assert plan(stack, canaries=("c",)).for_node("c").canary is True
    assert plan(stack, canaries=("c",)).for_node("a").canary is False
    assert rollout.Run.current(stack).canaries == ("c",)
    with pytest.raises(RolloutStoppedError, match="a: not updated: canary c reported nothing"):
        rollout.wait_for_canaries(rollout.Run.current(stack), "a", rollout.Run.current(stack).canaries, silence=0.0)
    # A run that lists no canary: the same node input does not wait at all.
    rollout.start_run(stack, ())
    with rollout.update(plan(stack, canaries=("c",)).for_node("a"), "a"):
        pass
    assert rollout.Run.current(stack).state("a") == (rollout.DONE, "")


def test_a_canaries_file_that_names_no_node_is_refused(stack):
    with pytest.raises(ConfigError, match=r"'\.\./x' is not a node id"):
        rollout.start_run(stack, ("../x",))
    run = rollout.Run.current(stack)  # the run before stays the current one
    (run.path / rollout.CANARIES_FILE).write_text("c\n../../etc\n")
    with pytest.raises(ConfigError, match=r"'\.\./\.\./etc' is not a node id"):
        rollout.Run.current(stack)
    (run.path / rollout.CANARIES_FILE).unlink()
    with pytest.raises(ConfigError, match="no current run"):
        rollout.Run.current(stack)


def test_a_silent_canary_is_given_up_on_with_a_clear_error(stack):
    run = rollout.Run.current(stack)
    with pytest.raises(RolloutStoppedError, match=r"a: not updated: canary c reported nothing for 0s this run"):
        rollout.wait_for_canaries(run, "a", ["c"], silence=0.0)


def test_creates_never_wait_and_a_canary_create_reports(stack):
    p = plan(stack, max_parallel=1, canaries=("c",))
    with rollout.onboarding(p.for_node("a"), "a"):  # the canary has reported nothing: a create does not wait for it
        pass
    with pytest.raises(RuntimeError), rollout.onboarding(p.for_node("c"), "c"):
        raise RuntimeError("c: cannot reach it")
    assert rollout.Run.current(stack).state("c") == (rollout.FAILED, "c: cannot reach it")


def test_a_new_run_ignores_the_markers_of_the_last_and_sweeps_old_ones(stack):
    first = rollout.Run.current(stack)
    first.mark("c", rollout.FAILED, "c: broken")
    old = stack / rollout.RUNS / "0123456789abcdef"
    old.mkdir()
    os.utime(old, (time.time() - 2 * rollout.KEEP_RUNS,) * 2)
    rollout.start_run(stack)
    second = rollout.Run.current(stack)
    assert second.run_id != first.run_id and second.failures() == [] and second.state("c") is None
    assert first.path.is_dir() and not old.exists()
    with rollout.update(plan(stack, 1, ("c",)).for_node("c"), "c"):
        pass


def test_the_directories_are_private_and_a_foreign_one_is_refused(stack, tmp_path):
    run = rollout.Run.current(stack)
    run.mark("a", rollout.DONE)
    for path in (stack, stack / rollout.RUNS, run.path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((run.path / "a.done").stat().st_mode) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="only it can write"):
        rollout.private_dir(shared)


def test_without_a_run_an_update_is_refused_and_a_diff_says_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(rollout.DIR_ENV, str(tmp_path))
    p = plan(tmp_path / "never-started", canaries=("c",))
    rollout.unchanged(p.for_node("c"), "c")  # a preview before any `pulumi up`: nothing to tell, no error
    with pytest.raises(ConfigError, match="no current run"), rollout.update(p.for_node("a"), "a"):
        pass


def test_stacks_of_other_checkouts_or_backends_do_not_share_a_directory(monkeypatch):
    a = rollout.stack_dir("/one", "org", "proj", "prod")
    assert a != rollout.stack_dir("/two", "org", "proj", "prod")
    monkeypatch.setenv("PULUMI_BACKEND_URL", "file:///elsewhere")
    assert a != rollout.stack_dir("/one", "org", "proj", "prod")
    assert a.name.startswith("prod-")


# --------------------------------------------------------------------------- the directory as another user would attack it

OTHER = 65534
"""Another user's uid (nobody's)."""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def foreign(path: Path) -> None:
    """``path`` (not followed if a symlink) given to another user, as if that user had made it."""
    os.lchown(path, OTHER, OTHER)


def forged_release(directory: Path) -> None:
    """What the other user plants: the canary's `done`, which would release every other node."""
    run = rollout.Run.current(directory)
    (run.path / "c.done").write_text("")


def test_a_planted_symlink_is_never_followed(tmp_path, monkeypatch):
    monkeypatch.setenv(rollout.DIR_ENV, str(tmp_path / "rollout"))
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory.parent.mkdir(mode=0o700)
    directory.symlink_to(elsewhere)  # a directory of ours, 0700: only the symlink is wrong
    with pytest.raises(ConfigError, match=r"the coordination directory .*prod-[0-9a-f]{16} is refused: it is a symlink"):
        rollout.start_run(directory)
    assert list(elsewhere.iterdir()) == [], "something was made through the symlink"

    # Planted after the run started (the providers check again): the stack's directory, the run's, then `runs`.
    directory.unlink()
    rollout.start_run(directory)
    directory.rename(elsewhere / "stack")
    directory.symlink_to(elsewhere / "stack")
    with pytest.raises(ConfigError, match=f"{directory} is refused: it is a symlink"):
        rollout.Run.current(directory)
    directory.unlink()
    (elsewhere / "stack").rename(directory)
    run = rollout.Run.current(directory)
    run.path.rename(elsewhere / "run")
    run.path.symlink_to(elsewhere / "run")
    with pytest.raises(ConfigError, match=f"{run.path} is refused: it is a symlink"):
        rollout.Run.current(directory)
    (directory / rollout.RUNS).rename(tmp_path / "runs-elsewhere")
    (directory / rollout.RUNS).symlink_to(tmp_path / "runs-elsewhere")
    with pytest.raises(ConfigError, match=r"/runs is refused: it is a symlink"):
        rollout.update(plan(directory, canaries=("c",)).for_node("a"), "a").__enter__()


def test_a_marker_that_is_a_symlink_is_refused(stack):
    run = rollout.Run.current(stack)
    (stack / "elsewhere").write_text("")
    (run.path / "c.done").symlink_to(stack / "elsewhere")
    with pytest.raises(ConfigError, match="c.done is not a file of its own"):
        run.state("c")


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_a_forged_done_in_a_directory_others_can_write_releases_no_one(stack, mode):
    forged_release(stack)
    run = rollout.Run.current(stack)
    run.path.chmod(mode)  # a run directory others could have written the `done` into
    refused = f"{run.path} is refused: it is not a directory of this user's that only it can write \\(mode {mode:04o}"
    with pytest.raises(ConfigError, match=refused), rollout.update(plan(stack, canaries=("c",)).for_node("a"), "a"):
        raise AssertionError("a forged marker released a non-canary")
    run.path.chmod(0o700)  # positive control: the same marker in a private directory does release it
    with rollout.update(plan(stack, canaries=("c",)).for_node("a"), "a"):
        pass


@needs_root
def test_a_directory_of_another_user_is_refused(stack, tmp_path):
    run = rollout.Run.current(stack)
    foreign(run.path)  # 0700, but another user's: they wrote the markers
    with pytest.raises(ConfigError, match=f"{run.path} is refused: it is not a directory of this user's .*owner {OTHER}"):
        rollout.Run.current(stack)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    foreign(theirs)
    with pytest.raises(ConfigError, match=f"owner {OTHER}"):
        rollout.private_dir(theirs)


@needs_root
def test_under_a_shared_sticky_directory_another_users_entries_are_refused(tmp_path, monkeypatch):
    """A shared 1777 directory (as /tmp) is fine to be under, but not through a symlink or directory that another
    user planted there before the first run."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv(rollout.DIR_ENV, str(shared / "rollout"))
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    rollout.start_run(directory)  # ours, under a sticky shared directory: fine
    forged_release(directory)
    rollout.Run.current(directory)

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    (shared / "rollout").rename(theirs / "rollout")
    (shared / "rollout").symlink_to(theirs / "rollout")
    foreign(shared / "rollout")  # the symlink is the other user's: they can point it anywhere
    with pytest.raises(ConfigError, match=f"it is reached through {shared / 'rollout'}, which belongs to user {OTHER}"):
        rollout.Run.current(directory)
    (shared / "rollout").unlink()
    (theirs / "rollout").rename(shared / "rollout")
    foreign(shared / "rollout")  # a directory above ours that is the other user's
    with pytest.raises(ConfigError, match=f"which belongs to user {OTHER}"):
        rollout.start_run(directory)


def test_a_directory_above_that_others_can_write_is_refused(tmp_path, monkeypatch):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)  # not sticky: a member of the group can rename our directory and put theirs in its place
    monkeypatch.setenv(rollout.DIR_ENV, str(team / "rollout"))
    with pytest.raises(ConfigError, match=f"it is reached through {team}, which others can write \\(mode 0775\\)"):
        rollout.start_run(rollout.stack_dir("/project", "org", "proj", "prod"))
    assert not (team / "rollout").exists()
    team.chmod(0o1775)
    rollout.start_run(rollout.stack_dir("/project", "org", "proj", "prod"))


@pytest.mark.parametrize("run_id", ["../../../../tmp/x", "..", "0123456789abcdef/..", "0123456789ABCDEF",
                                    "0123456789abcdef0", "0123456789abcde\n"])
def test_a_run_id_that_is_not_one_of_ours_is_refused(stack, run_id):
    target = stack / rollout.RUNS / run_id
    with contextlib.suppress(OSError):
        target.mkdir(mode=0o700, parents=True)
    (stack / rollout.RUN_FILE).write_text(run_id)
    with pytest.raises(ConfigError, match="file names no run id of this package's"):
        rollout.Run.current(stack)


def test_the_sweep_removes_only_old_run_directories(stack, tmp_path):
    runs = stack / rollout.RUNS
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("not the package's")
    (runs / "0123456789abcdef").symlink_to(keep)
    (runs / "notes").mkdir()
    for p in (runs / "notes", runs / "0123456789abcdef"):
        os.utime(p, (time.time() - 2 * rollout.KEEP_RUNS,) * 2, follow_symlinks=False)
    rollout.start_run(stack)
    assert (keep / "file").exists() and (runs / "notes").is_dir()


def test_a_relative_directory_is_walked_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(rollout.DIR_ENV, "rollout")
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    rollout.start_run(directory)
    assert rollout.Run.current(directory).path.parent == tmp_path / "rollout" / directory.name / rollout.RUNS
