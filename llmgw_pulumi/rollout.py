"""Safe fleet-wide upgrades: canaries first, at most N agents restarting at once, stop after a failure.

A stack's nodes may be spread over several provider processes (``llmgw_pulumi.stack.shards``),
so the coordination lives where every one of them can see it: a directory on the
operator's machine, the one running `pulumi up`.

The stack's directory
    ``$LLMGW_ROLLOUT_DIR`` (default ``$XDG_STATE_HOME/llmgw-pulumi/rollout``, i.e.
    ``~/.local/state/llmgw-pulumi/rollout``), then one directory per stack, named
    by the stack and a hash of the project directory, the organization, project and
    stack names and the backend URL (two checkouts or backends never share one).
    Every directory is made 0700 and must be owned by the user running Pulumi and
    writable by nobody else; each file in it is 0600. None of them is followed if
    it is a symlink, and every directory above them (and every symlink on the way)
    must be root's or the user's and writable by no one else, unless it is sticky
    (as /tmp). Each provider checks the directories again when it reads the run,
    and a run id is used as a directory name only if it is 16 hex digits.

This run
    The program, when it runs for `pulumi up` (never for a preview), writes a fresh
    random run id into ``<stack dir>/run`` before it registers any resource, and makes
    ``<stack dir>/runs/<run id>/``, with the run's canary list in its ``canaries`` file
    (a node id a line). Each provider reads the run id, and the canaries, when an agent's
    update needs them. Markers of an earlier run, finished or crashed, live in another
    run's directory and are never read again; run directories older than a day are
    removed when a new run starts. Slots are locks (``flock``) on files of the run's
    directory: a lock dies with the process holding it, so a crashed run leaves no
    slot taken.

What a node is given
    Its AgentInstall's ``rollout`` input is its share of llmgw:rollout
    (``specs.NodeRollout``): ``maxParallel``, the stack's directory, and whether the node
    is a canary. The canary list itself is in no node's state: naming new canaries (as
    each day's upgrade does) changes the inputs of the nodes that become or stop being
    canaries, and leaves the rest of the fleet's state as it was.

What a node writes (``runs/<run id>/<node id>.<state>``)
    ``started`` when its update begins, then ``done`` or ``failed`` (with the error's
    first line); a canary whose agent has nothing to change this run writes
    ``unchanged`` (from the provider's diff or an update that does not touch the
    node); a canary that is onboarded for the first time writes ``done`` or
    ``failed`` too.

An update of a running agent (a new version, or new config) then goes:
    1. refuse if any node's update failed in this run;
    2. a non-canary waits until every canary is ``done`` or ``unchanged``; a
       ``failed`` canary refuses it. A canary that reports nothing for
       ``CANARY_SILENCE`` seconds (its certificate or identity step failed or hangs,
       or the deployment stopped elsewhere) refuses it too, saying so;
    3. take one of ``maxParallel`` slots (waiting while all are taken, refusing as
       soon as a failure shows up), check for a failure once more, write
       ``started``;
    4. install and restart (install-agent.sh rolls a new agent that does not stay
       up back), write ``done`` or ``failed``, give the slot back.
    A canary skips step 2. A refused node's agent is untouched: it keeps its version
    and stays connected, and its error names the node that failed and the fix.
    Creates (first-time onboarding) never wait and take no slot.

An unreachable canary fails its update after ``ssh.wait`` (``failed``): the others
are refused. A canary with no change this run reports ``unchanged`` from its diff,
so the others do not wait for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import slots, validate
from .config.specs import NodeRollout
from .errors import ConfigError, RolloutStoppedError

DIR_ENV = "LLMGW_ROLLOUT_DIR"
RUN_FILE = "run"
RUNS = "runs"
CANARIES_FILE = "canaries"
STARTED, DONE, FAILED, UNCHANGED = "started", "done", "failed", "unchanged"
STATES = (FAILED, DONE, UNCHANGED, STARTED)
"""A node's states, the one that counts first when several are there."""
POLL = 0.2
"""Seconds between two looks at the markers and slots while waiting."""
CANARY_SILENCE = 600.0
"""Seconds a non-canary waits for a canary that has reported nothing at all this run."""
KEEP_RUNS = 86400.0
"""Run directories older than this are removed when a new run starts."""


def base_dir() -> Path:
    """Where every stack's coordination directory is (see the module's docstring)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "llmgw-pulumi" / "rollout"


def stack_dir(project_dir: str, organization: str, project: str, stack: str) -> Path:
    """The coordination directory of one stack, as seen from ``project_dir`` (not made here)."""
    key = "\0".join([os.path.abspath(project_dir), organization, project, stack, os.environ.get("PULUMI_BACKEND_URL", "")])
    return base_dir() / f"{stack}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


RUN_ID = re.compile(r"[0-9a-f]{16}")
"""A run id (``secrets.token_hex(8)``): the only names a run directory may have."""
_MAX_SYMLINKS = 40


def _refusal(path: Path | str, why: str) -> ConfigError:
    return ConfigError("llmgw", "rollout", f"the coordination directory {path} is refused: {why}",
                       f"remove it, or set {DIR_ENV} to a directory of your own, under directories only you "
                       "(or root) can write")


def _check_above(path: Path, st: os.stat_result) -> None:
    """A directory above the coordination directory, or a symlink met on the way to it: root's or this user's,
    and writable by no one else, unless it is a sticky directory (as /tmp: there no one else can rename or
    remove what is root's or ours, and the next component is checked to be)."""
    if st.st_uid not in (0, os.getuid()):
        raise _refusal(path, f"it is reached through {path}, which belongs to user {st.st_uid}")
    if stat.S_ISLNK(st.st_mode):
        return
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        raise _refusal(path, f"it is reached through {path}, which others can write "
                             f"(mode {stat.S_IMODE(st.st_mode):04o})")


def _walk_above(path: Path) -> Path:
    """``path`` (made absolute) as the kernel resolves it, every directory and symlink on the way checked
    (``_check_above``), without following a symlink before it is checked; the part that does not exist yet
    is kept as written (``..`` in it taken lexically)."""
    todo = list(Path(os.path.abspath(path)).parts[1:])
    real = Path("/")
    _check_above(real, os.lstat(real))
    hops = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            real = real.parent
            continue
        step = real / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return Path(os.path.normpath(Path(step, *todo)))
        _check_above(step, st)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise _refusal(path, f"its symlinks do not resolve (at {step})")
            target = Path(os.readlink(step))
            if target.is_absolute():
                real = Path("/")
            todo = [*target.parts[1 if target.is_absolute() else 0:], *todo]
        elif stat.S_ISDIR(st.st_mode):
            real = step
        else:
            raise _refusal(path, f"{step} is not a directory")
    return real


def _check_private(path: Path, st: os.stat_result) -> None:
    """One of the package's own directories: a directory (not a symlink), this user's, writable by no one else."""
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, "it is a symlink, not a directory of this user's that only it can write")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refusal(path, "it is not a directory of this user's that only it can write "
                             f"(mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid})")


def private_dir(path: Path) -> Path:
    """``path`` made 0700 (each missing directory above it too), and checked: a directory of this user's that
    no one else can write, never followed if it is a symlink; every directory above it, and every symlink on
    the way, root's or this user's and writable by no one else unless sticky. Returns it as resolved."""
    above = _walk_above(path.parent)
    for missing in reversed([d for d in (above, *above.parents) if not os.path.lexists(d)]):
        with contextlib.suppress(FileExistsError):
            os.mkdir(missing, 0o700)
    real = _walk_above(path.parent) / path.name
    with contextlib.suppress(FileExistsError):
        os.mkdir(real, 0o700)
    _check_private(real, os.lstat(real))
    return real


def checked_dir(path: Path) -> Path:
    """An existing directory of the package's, checked as ``private_dir`` checks it (nothing is made);
    FileNotFoundError when it is not there."""
    real = _walk_above(path.parent) / path.name
    _check_private(real, os.lstat(real))
    return real


def _read(path: Path) -> str | None:
    """A file of one of the package's directories (never followed if it is a symlink); None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(path.parent, f"{path.name} is not a file of its own ({exc.strerror})") from exc
    with os.fdopen(fd) as f:
        return f.read()


def _node(node: str) -> str:
    """``node``, refused unless it is a node id: a DNS label, never a path nor more than one line."""
    if validate.node_id(node) is not None or "\n" in node:
        raise ConfigError(node, "rollout", f"{node!r} is not a node id a marker can be named by",
                          "give nodes ids that are DNS labels")
    return node


def _node_file(node: str, state: str) -> str:
    """The name of a node's marker."""
    return f"{_node(node)}.{state}"


def _write(path: Path, text: str) -> None:
    """Write a file atomically (0600): readers see all of it or none."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(temp, path)


def start_run(directory: Path, canaries: Sequence[str] = (), now: float | None = None) -> str:
    """A new run of this stack (the program calls it once per `pulumi up`): its id, written to ``<dir>/run``
    once its directory holds the run's ``canaries`` (validated node ids, as llmgw:rollout names them)."""
    directory = private_dir(directory)
    runs = private_dir(directory / RUNS)
    now = time.time() if now is None else now
    for old in runs.iterdir():
        with contextlib.suppress(OSError):
            st = os.lstat(old)
            if RUN_ID.fullmatch(old.name) and stat.S_ISDIR(st.st_mode) and now - st.st_mtime > KEEP_RUNS:
                shutil.rmtree(old)
    run = secrets.token_hex(8)
    path = private_dir(runs / run)
    _write(path / CANARIES_FILE, "".join(f"{_node(c)}\n" for c in canaries))
    _write(directory / RUN_FILE, run + "\n")
    return run


@dataclass(frozen=True)
class Run:
    """The current run's markers and slots."""

    path: Path
    run_id: str
    canaries: tuple[str, ...] = ()
    """The nodes this run updates first (its ``canaries`` file)."""

    @classmethod
    def current(cls, directory: Path) -> Run:
        """The run the program started, its directories checked again (``checked_dir``) each time a provider
        asks: markers are only ever read from directories of this user's that no one else can write."""
        try:
            directory = checked_dir(directory)
            run_id = (_read(directory / RUN_FILE) or "").strip()
            if run_id and not RUN_ID.fullmatch(run_id):
                raise _refusal(directory, f"its {RUN_FILE} file names no run id of this package's ({run_id[:40]!r})")
            path = checked_dir(checked_dir(directory / RUNS) / run_id) if run_id else None
        except FileNotFoundError:
            path = None
        listed = _read(path / CANARIES_FILE) if path is not None else None
        if path is None or listed is None:
            raise ConfigError("llmgw", "rollout", f"no current run in {directory}: the program did not start one",
                              "run `pulumi up` with this project's program, which starts the run")
        return cls(path, run_id, tuple(_node(c) for c in listed.splitlines()))

    def mark(self, node: str, state: str, text: str = "") -> None:
        _write(self.path / _node_file(node, state), text)

    def state(self, node: str) -> tuple[str, str] | None:
        """(state, text) of ``node`` this run, or None when it has reported nothing."""
        for state in STATES:
            text = _read(self.path / _node_file(node, state))
            if text is not None:
                return state, text
        return None

    def failures(self) -> list[tuple[str, str]]:
        """(node, what failed) of every node whose update failed this run, by node id."""
        found = ((p.name[: -len(FAILED) - 1], _read(p)) for p in self.path.glob(f"*.{FAILED}"))
        return sorted((node, text) for node, text in found if text is not None)

    @contextlib.contextmanager
    def slot(self, limit: int, give_up: Callable[[], None]) -> Iterator[int]:
        """Hold one of ``limit`` slots (an exclusive flock on ``slot-<k>``); ``give_up()`` is called while
        waiting and may raise to stop waiting."""
        def wait() -> None:
            give_up()
            time.sleep(POLL)

        with slots.one_of([self.path / f"slot-{k}" for k in range(limit)], wait) as k:
            yield k


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _refuse_after_failure(run: Run, node: str) -> None:
    failed = run.failures()
    if failed:
        who, what = failed[0]
        raise RolloutStoppedError(node, f"not updated: the rollout stopped because the update of {who} failed "
                                        f"({what}); this node keeps its previous agent, running")


def wait_for_canaries(run: Run, node: str, canaries: Sequence[str], silence: float = CANARY_SILENCE) -> None:
    """Return once every canary is done or unchanged this run; raise once one failed or stays silent."""
    start = time.monotonic()
    while True:
        _refuse_after_failure(run, node)
        states = {c: run.state(c) for c in canaries if c != node}
        pending = [c for c, s in states.items() if s is None or s[0] == STARTED]
        if not pending:
            return
        silent = [c for c in pending if states[c] is None]
        if silent and time.monotonic() - start > silence:
            raise RolloutStoppedError(
                node, f"not updated: canary {silent[0]} reported nothing for {silence:.0f}s this run (its certificate "
                      "or identity step may have failed, or the deployment stopped elsewhere: see the errors above); "
                      "this node keeps its previous agent, running")
        time.sleep(POLL)


@contextlib.contextmanager
def update(policy: NodeRollout | None, node: str) -> Iterator[None]:
    """An update of ``node``'s running agent, gated as the module's docstring says (no policy: not gated)."""
    if policy is None or not policy.directory:
        yield
        return
    run = Run.current(Path(policy.directory))
    _refuse_after_failure(run, node)
    if not policy.canary:
        wait_for_canaries(run, node, run.canaries)
    slot = run.slot(policy.max_parallel, lambda: _refuse_after_failure(run, node)) if policy.max_parallel \
        else contextlib.nullcontext()
    with slot:
        _refuse_after_failure(run, node)
        run.mark(node, STARTED)
        with reported(run, node):
            yield


@contextlib.contextmanager
def reported(run: Run, node: str) -> Iterator[None]:
    """Mark ``node`` done when the block succeeds, failed (with the error's first line) when it raises."""
    try:
        yield
    except BaseException as exc:
        run.mark(node, FAILED, first_line(exc))
        raise
    run.mark(node, DONE)


@contextlib.contextmanager
def onboarding(policy: NodeRollout | None, node: str) -> Iterator[None]:
    """A create: never waits; a canary reports its result, as its update would."""
    if policy is None or not policy.directory or not policy.canary:
        yield
        return
    with reported(Run.current(Path(policy.directory)), node):
        yield


def unchanged(policy: NodeRollout | None, node: str) -> None:
    """A canary whose agent has nothing to change this run says so, so that no one waits for it.

    Called from the provider's diff too, which must not fail: without a run (a
    preview before any `pulumi up`) there is no one to tell.
    """
    if policy is not None and policy.directory and policy.canary:
        with contextlib.suppress(ConfigError, OSError):
            Run.current(Path(policy.directory)).mark(node, UNCHANGED)
