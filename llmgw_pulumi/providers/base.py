"""What all four providers share: check from a spec, diff by declared keys, outputs = inputs + computed.

Pulumi facts this encodes:
- diff, update, read and delete receive the old *outputs*, so create and update
  return every input too;
- numbers arrive as floats, so values are normalised before comparing;
- ``__provider`` is never a reason to change anything;
- check and diff must not touch the network; they only compare values;
- a CheckFailure with a property name makes the engine print the value, which
  may be secret, so every failure is reported under the empty property with the
  field named in the reason;
- every preview starts the provider processes and calls check and diff in
  them, so what only create/update/read/delete need (paramiko, through the
  transport) is imported on first use, not when a provider module loads.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, TypeVar

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ReadResult, Resource, ResourceProvider

from .. import decisions, errors
from ..boundary import pulumi_errors, to_inputs
from ..config.schema import normalise as normalise  # the diff's, and the review's (fleet_review)
from ..config.schema import replace_keys
from ..config.specs import Connection, Problems, is_unknown
from ..errors import LlmgwError
from ..nodestate import commands, facts
from ..nodestate.commands import EXIT_ERRORS, Exit, Result
from ..nodestate.desired import NodeFile
from ..ssh import sessions
from ..ssh.sessions import Runner
from ..text import printable
from ..validate import HOME_PREFIX
from . import _diagnostics

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
S = TypeVar("S")
log = logging.getLogger(__name__)

PROVIDER_KEY = "__provider"
READ_WAIT = 15.0
"""Seconds `pulumi refresh` waits for a node: a refresh meets onboarded machines, not booting ones."""


class ModuleProvider(ResourceProvider):
    """A provider whose resources all use one instance, its module's ``PROVIDER``, and which is pickled as that
    name.

    The SDK stores the provider it is given, pickled, in each resource's inputs and again in its outputs
    (``__provider``, base64). A class instance is pickled as its module, its class name and a constructor
    call; the module's instance, as its module and ``PROVIDER``, which is shorter, and each is kept twice, in
    inputs and outputs. An instance pickled either way loads (a state
    written before keeps its payload until the resource's next update). The payload holds nothing secret
    (``serialize_as_secret_always``) and nothing of the machine: the providers are stateless, every method works
    from its arguments alone."""

    serialize_as_secret_always = False
    INSTANCE = "PROVIDER"
    """The name of the module's one instance."""

    def __reduce__(self) -> str:
        # A string: pickle stores a reference to the module's global of that name, which must be this object.
        return self.INSTANCE

    @classmethod
    def instance(cls) -> ResourceProvider:
        """The module's one instance, the one every resource is registered with."""
        found = vars(sys.modules[cls.__module__]).get(cls.INSTANCE)
        if type(found) is not cls:
            raise TypeError(f"{cls.__module__}.{cls.INSTANCE} must be the one {cls.__name__}")
        return found


def for_read(conn: Any) -> Any:
    """The connection as read() uses it: waiting at most READ_WAIT for the node."""
    return dataclasses.replace(conn, wait=min(conn.wait, READ_WAIT))
CONNECTION_REPLACE_KEYS = replace_keys(Connection)
"""A different address or port is a different machine: its resources are replaced, not updated."""


def check(news: Mapping[str, Any], collect: Callable[[Mapping[str, Any], Problems], None],
          defaults: Mapping[str, Any] | None = None, derive: Callable[[dict[str, Any]], None] | None = None,
          olds: Mapping[str, Any] | None = None, machine_facts: Iterable[str] = ()) -> CheckResult:
    """Validate ``news``; fill defaults so state shows what is in effect; add derived inputs.

    ``machine_facts`` are inputs that come from NodeIdentity's outputs (the
    hostname, the host key). While NodeIdentity is being updated, a preview
    cannot know them (a dynamic provider's update does not run in preview), yet
    they cannot change as long as the machine is the same: the old values are
    carried forward, so renewing a certificate does not show the agent as
    changing too.
    """
    _diagnostics.install()  # check is a provider process's first call: from here on it serves every call at once
    node = news.get("node_id")
    problems = Problems(node if isinstance(node, str) else "?")
    inputs = {**(defaults or {}), **{k: v for k, v in news.items() if v is not None}}
    if olds and same_machine(olds, inputs):
        for key in machine_facts:
            if is_unknown(inputs.get(key)) and olds.get(key) is not None:
                inputs[key] = olds[key]
    if "known_jump_host_keys" in inputs and no_jump_hosts(inputs) and (
            is_unknown(inputs["known_jump_host_keys"]) or not inputs["known_jump_host_keys"]):
        del inputs["known_jump_host_keys"]  # none to know: not a value a preview waits for
    collect(inputs, problems)
    # The engine prints a reason as it is: a bad node id (or key) given with a newline or an escape is shown escaped.
    failures = [CheckFailure("", printable(f"{problems.node}: {name}: {problem}. Fix: {fix}"))
                for name, problem, fix in problems]
    if not failures and derive is not None:
        derive(inputs)
    return CheckResult(inputs, failures)


def no_jump_hosts(inputs: Mapping[str, Any]) -> bool:
    """The connection is known and goes through no jump host."""
    conn = inputs.get("connection")
    return isinstance(conn, Mapping) and not is_unknown(conn.get("jump")) and not conn.get("jump")


def same_machine(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """Both sides name the same, known, address and port."""
    old, new = olds.get("connection"), news.get("connection")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return False
    return all(not is_unknown(new.get(k)) and normalise(old.get(k)) == normalise(new.get(k)) for k in CONNECTION_REPLACE_KEYS)


def changed_keys(olds: Mapping[str, Any], news: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """Input keys whose value differs; a nested ``connection`` is compared field by field."""
    changed = []
    for key in keys:
        old, new = olds.get(key), news.get(key)
        if key == "connection" and isinstance(old, Mapping) and isinstance(new, Mapping):
            for sub in sorted(set(old) | set(new)):
                if sub in ("host_key", "private_key", "private_key_path") and new.get(sub) is None:
                    # An unpinned host key is recorded in outputs; a missing key is a
                    # reviewer's preview. Neither is a change.
                    continue
                if sub == "private_key_path" and same_key_file(old.get(sub), new.get(sub)):
                    continue
                if is_unknown(new.get(sub)) or normalise(old.get(sub)) != normalise(new.get(sub)):
                    changed.append(f"connection.{sub}")
        elif key == "known_jump_host_keys" and (is_unknown(new) or not new):
            continue  # none recorded yet (no jump hosts, or a stack older than them): nothing to compare
        elif is_unknown(new) or normalise(old) != normalise(new):
            changed.append(key)
    return changed


def same_key_file(old: Any, new: Any) -> bool:
    """Do two recorded SSH key paths name the same file as written: equal, or ``~/.ssh/id_fleet`` against the
    absolute path an earlier package recorded for it (``/home/alice/.ssh/id_fleet``, under whichever home
    directory ran it). Where the home directory is differs from machine to machine, not what the path says."""
    if not isinstance(old, str) or not isinstance(new, str):
        return False
    if old == new:
        return True
    written, absolute = (new, old) if new.startswith(HOME_PREFIX) else (old, new)
    return (written.startswith(HOME_PREFIX) and absolute.startswith("/")
            and absolute.endswith(written[len(HOME_PREFIX) - 1:]))


def carried(olds: Mapping[str, Any], news: Mapping[str, Any], output_keys: Iterable[str]) -> dict[str, Any]:
    """The new inputs with the outputs the last operation found: an update that did not touch the node."""
    return outputs(news, **{k: olds.get(k) for k in output_keys})


def diff_result(changes: list[str], replace_keys: Iterable[str]) -> DiffResult:
    """Changes, and the replacements among them (always created before the old one is deleted)."""
    replace = set(replace_keys)
    replaces = [c for c in changes if c in replace or c.split(".")[0] in replace]
    return DiffResult(
        changes=bool(changes),
        replaces=replaces,
    )


def outputs(props: Mapping[str, Any], **computed: Any) -> dict[str, Any]:
    """Outputs are all inputs plus what the operation found out (None values dropped)."""
    return {**{k: v for k, v in props.items() if v is not None}, **{k: v for k, v in computed.items() if v is not None}}


def operator_errors(fn: F) -> F:
    """Wrap a provider's create/update/read/delete: what it logs is shown under its resource, the
    package's errors carry a one-frame traceback (none in a provider process: ``_diagnostics.quiet_tracebacks``)
    and are said once more, in one line, as an error of the stack (``_diagnostics.report_failed``), and a
    ConfigError is a pulumi.RunError too.

    The resource is the one the engine's request names (``_diagnostics.about``). The
    engine shows a provider's whole traceback; for an error that already says
    what happened and what to do, the frames inside the package are noise.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _diagnostics.install()
        with _diagnostics.about():
            try:
                with pulumi_errors():
                    return fn(*args, **kwargs)
            except LlmgwError as exc:
                _diagnostics.report_failed(exc.summary())  # the line of the end-of-run list of failed nodes
                raise exc.with_traceback(None) from None
            except Exception as exc:  # a bug: its frames in the package, which quiet_tracebacks leaves out of the message
                exc.add_note("".join(traceback.format_tb(exc.__traceback__, limit=64)).rstrip())
                raise

    return wrapper  # type: ignore[return-value]


def read_result(id_: str, props: Mapping[str, Any], output_keys: Iterable[str], outs: Mapping[str, Any],
                seen: Mapping[str, Any]) -> ReadResult:
    """What read() returns for a node that answered: the outputs it found and, where the node differs from
    what was installed, inputs that say how (``seen``: input -> the node's value, None where it is as wanted).

    A preview compares the stored inputs with the program's, so the preview after
    a refresh shows, property by property, what drifted (the text of agent.yaml
    on the node against the text wanted, a key file's mode). The engine keeps
    the inputs' secrets secret (it copies their secretness from the old inputs).
    """
    drifted = {k: v for k, v in seen.items() if v is not None}
    if not drifted:
        return ReadResult(id_, dict(outs))
    skip = {*output_keys, PROVIDER_KEY}
    inputs = {k: v for k, v in props.items() if k not in skip}
    return ReadResult(id_, dict(outs), {**inputs, **drifted})


@dataclasses.dataclass(frozen=True)
class Surveyed:
    """What read() found on a node that answered."""

    node: facts.NodeFacts
    jump_host_keys: dict[str, str]


def survey_for_read(conn: Any, node: str, known: tuple[str | None, Mapping[str, str] | None],
                    files: Sequence[NodeFile], texts: Sequence[NodeFile] = ()) -> Surveyed | None:
    """read(): the node's files surveyed, waiting at most READ_WAIT for it; None, with a warning, when the node
    does not answer (see unreachable_on_read)."""
    def survey() -> Surveyed:
        with session(for_read(conn), node, *known) as s:
            res = s.run(commands.survey(files, texts))
            return Surveyed(facts.parse_survey(res.stdout), s.jump_host_keys)

    try:
        return read_once_more(survey, node)
    except errors.UnreachableError as exc:
        warn_state_kept(exc)
        return None


def read_once_more(read: Callable[[], T], node: str) -> T:
    """Run a read-only step; if its SSH connection broke, run it once more over a new one (a read changes
    nothing on the node, so running it again is safe; a change is never repeated behind the operator's back)."""
    try:
        return read()
    except errors.RemoteCommandError as exc:
        if not exc.connection_broke:
            raise
        log.info("%s: the SSH connection broke during a read; reading again over a new one", node)
        return read()


def unreachable_on_read(id_: str, props: dict[str, Any], exc: Exception) -> ReadResult:
    """What read() returns for a node that does not answer: the resource as it was, with a warning.

    An outage (or a refresh run from where the nodes cannot be reached) must
    never rewrite the fleet's record: only a node removed from the config is
    deleted, by `pulumi up`; `pulumi destroy` lets a machine that is gone for
    good go.
    """
    warn_state_kept(exc)
    return ReadResult(id_, props)


def warn_state_kept(exc: Exception) -> None:
    """The warning of a read that could not reach its node (see unreachable_on_read), marked so that the review
    of a preview knows it (``decisions.unreadable_warning``)."""
    log.warning("%s", decisions.unreadable_warning(str(exc)))


_EXIT_ERRORS: dict[int, type[LlmgwError]] = {code: getattr(errors, name) for code, name in EXIT_ERRORS.items()}
"""Each exit code's error, as scripts/exits.sh names it."""


def raise_for(res: Any, node: str, doing: str) -> None:
    """Turn a failed remote script into the package error its exit code names.

    Its stderr is the node's text: made printable, newlines too (shown as ``\\n``), so it can neither drive
    the operator's terminal nor forge a line of the message such as its ``fix:``."""
    if res.rc == 0:
        return
    reason = printable(res.stderr.strip()[-2000:])
    if res.rc in _EXIT_ERRORS:
        raise _EXIT_ERRORS[res.rc](node, reason)
    raise errors.RemoteCommandError(node, f"{doing} failed (exit {res.rc}): {reason}")


def run_fresh(node: str, seen: S | None, read: Callable[[], S], run: Callable[[S], Result]) -> Result:
    """Carry out a change planned from what the node was seen holding: ``run(seen)`` makes the plan
    (llmgw_pulumi.nodestate.plan) and runs its script. ``seen`` None (a create, or no record to trust): ``read()`` the node
    first. The script re-checks the plan under the node's lock; when it exits STALE (the node changed since it
    was read), the node is read once more and the change planned and run again. A second STALE is returned as it
    is, and raise_for makes it a NodeChangedError: nothing was changed."""
    res = run(read() if seen is None else seen)
    if res.rc == Exit.STALE:
        log.info("%s: the node changed since it was read: reading it again", node)
        res = run(read())
    return res


def remove_from_node(conn: Any, node: str, known: tuple[str | None, Mapping[str, str] | None], script: Any,
                     what: str) -> None:
    """A delete: run the removal ``script`` on the node. A node that cannot be reached is a machine that is gone,
    and took its files with it (a warning, not an error). So is one that presents another host key than this
    resource recorded: the machine it was installed on is not there (re-imaged, and declared so by replacing the
    node's resources), and nothing is run on a machine it does not know."""
    try:
        with session(conn, node, *known) as s:
            res = s.run(script)
    except errors.UnreachableError as exc:
        log.warning("%s; assuming the machine is gone, nothing was removed from it", exc)
        return
    except errors.HostKeyChangedError as exc:
        log.warning("%s: %s; this is not the machine %s was installed on, nothing was removed from it",
                    node, exc.message, what)
        return
    raise_for(res, node, f"removing {what} from {conn.host}")


def known_keys(*props: Mapping[str, Any]) -> tuple[str | None, Mapping[str, str] | None]:
    """The host keys NodeIdentity recorded, as AgentInstall and EngineCheck get them (``known_host_key``,
    ``known_jump_host_keys``): from the first of ``props`` (e.g. the new inputs, then the old) that has them."""
    host_key = next((p["known_host_key"] for p in props if p.get("known_host_key")), None)
    jump_keys = next((p["known_jump_host_keys"] for p in props if p.get("known_jump_host_keys")), None)
    return host_key, jump_keys


def session(conn: Any, node: str, expected_host_key: str | None,
            expected_jump_keys: Mapping[str, str] | None = None) -> AbstractContextManager[Runner]:
    """A session to the node from the process's current ``sessions.Nodes`` (the SSH pool, imported on first use)."""
    return sessions.current().session(conn, node, expected_host_key, expected_jump_keys)


@dataclasses.dataclass
class OnboardedNodeArgs:
    """The inputs every resource that works on an onboarded node starts with (AgentInstall, EngineCheck)."""

    node_id: pulumi.Input[str]
    connection: Connection
    known_host_key: pulumi.Input[str]
    """The host key NodeIdentity recorded (or was pinned): every connection must see it."""
    known_jump_host_keys: pulumi.Input[Mapping[str, str]] | None = dataclasses.field(default=None, kw_only=True)
    """The jump hosts' keys NodeIdentity recorded, by 'host:port'."""


def declared_outputs(resource: type) -> tuple[str, ...]:
    """The attributes a resource class declares as ``name: pulumi.Output[...]`` (its own, not its bases')."""
    return tuple(name for name, hint in vars(resource).get("__annotations__", {}).items()
                 if str(hint).startswith(("pulumi.Output", "Output")))


class NodeResource(Resource):
    """One of the package's resources: its inputs are its Args dataclass (``boundary.to_inputs``); each attribute
    it declares as ``name: pulumi.Output[...]`` is one of its provider's output keys or one of the inputs it
    shows (``SHOWN_INPUTS``), so the declaration is the one list of them."""

    PROVIDER: ClassVar[type[ModuleProvider]]
    SHOWN_INPUTS: ClassVar[tuple[str, ...]] = ()
    """Declared attributes that are inputs (given, or derived by check), not outputs of the provider."""
    SECRET_OUTPUTS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def output_keys(cls) -> tuple[str, ...]:
        """What the provider adds to the inputs: the declared attributes but SHOWN_INPUTS."""
        return tuple(k for k in declared_outputs(cls) if k not in cls.SHOWN_INPUTS)

    @classmethod
    def registration(cls, name: str, args: Any, opts: pulumi.ResourceOptions | None,
                     **hidden: Any) -> tuple[ResourceProvider, str, dict[str, Any], pulumi.ResourceOptions | None]:
        """What the class's ``__init__`` passes to ``pulumi.dynamic.Resource.__init__`` (called there directly, so
        that the call stack the SDK records holds no frame of this base)."""
        # A declared attribute is only set from the engine's answer if its key is among the properties sent.
        props = {**{k: None for k in declared_outputs(cls)}, **(to_inputs(args) or {}), **hidden}
        if cls.SECRET_OUTPUTS:
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=list(cls.SECRET_OUTPUTS)))
        return cls.PROVIDER.instance(), name, props, opts
