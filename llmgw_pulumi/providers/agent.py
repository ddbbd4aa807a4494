"""AgentInstall: the llmgw binary, /etc/llmgw/agent.yaml and the llmgw-agent unit, running.

SPEC steps 5, 6 and 8. The rendered agent.yaml, but for its two comment
lines, is an input (derived in check, without touching the network), so
`pulumi preview --diff` shows the config text that will change; the unit,
the same for every node, is the input ``unit`` as its ``sha256:`` digest. The outputs keep both as digests
(``observed.text_digest``): a text rendered from the inputs is rendered again
where it is needed (``texts_of``). Changing settings rewrites the config atomically
and restarts the agent; changing the version installs the new binary (a
release must have the sha256 approved on the operator's side, see
llmgw_pulumi.releases.approval, and report its tag); nothing is re-issued.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult
from pulumi.output import Unknown

from .. import decisions, rollout
from ..config.registration import RegistrationCheck
from ..config.specs import NODE_REPLACE_KEYS, AgentSettings, AgentSpec, BinarySource, NodeRollout, build, is_unknown, names
from ..errors import ConfigError
from ..nodestate import commands, desired, facts, observed, plan
from ..nodestate.observed import OBSERVED_KEY, RENDERED_KEYS, STATE_VERSION, VERSION_KEY, Observed, Wanted
from ..releases import approval
from . import _registration, base

SETTINGS_KEYS = ("node_id", *names(AgentSettings))
"""The inputs agent.yaml is rendered from: the node id and AgentSettings' fields, each an input of its own."""
BINARY_KEYS = tuple(name for name in names(BinarySource) if name not in BinarySource.RELEASE_FIELDS)
RELEASE_KEYS = BinarySource.RELEASE_FIELDS
"""How a release is verified and carried: inputs only (used by create and update), never compared by the diff (a
preview fetches nothing, so it cannot know the digests) and not repeated in the outputs."""
INPUT_KEYS = ("connection", "known_host_key", "known_jump_host_keys", "hostname", *SETTINGS_KEYS, *BINARY_KEYS,
              "agent_yaml", "unit")
REPLACE_KEYS = NODE_REPLACE_KEYS
log = logging.getLogger(__name__)
TEXT_FILES_BY_INPUT = {"agent_yaml": desired.file_with(desired.Content.AGENT_YAML, desired.AGENT),
                       "unit": desired.file_with(desired.Content.UNIT, desired.AGENT)}
"""The agent's text files, by the input that holds their text."""
TEXT_FILES = tuple(TEXT_FILES_BY_INPUT.values())
FILES = desired.files_of(desired.AGENT)
BINARY_FILE = desired.file_with(desired.Content.BINARY, desired.AGENT)


def derive(inputs: dict[str, Any]) -> None:
    """Render agent.yaml's settings from the (validated) inputs, for the preview to show (without the file's two
    comment lines, ``desired.agent_yaml_settings``), and name the unit by its digest."""
    inputs["unit"] = observed.text_digest(desired.render_unit())
    relevant = [inputs.get(k) for k in ("hostname", *SETTINGS_KEYS)]
    if any(is_unknown(v) for v in relevant) or not isinstance(inputs.get("hostname"), str):
        inputs["agent_yaml"] = Unknown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        return
    inputs["agent_yaml"] = desired.agent_yaml_settings(inputs["node_id"], AgentSettings.from_props(inputs),
                                                       inputs["hostname"])


def _rendered(key: str, props: Mapping[str, Any]) -> str | None:
    """The text of ``key`` (``agent_yaml``, ``unit``) as this package renders it from ``props``."""
    if key == "unit":
        return desired.render_unit()
    if not isinstance(props.get("node_id"), str) or not isinstance(props.get("hostname"), str):
        return None
    return desired.render_agent_yaml(props["node_id"], AgentSettings.from_props(props), props["hostname"])


whole = observed.whole_text
digested = observed.digested


def texts_of(props: Mapping[str, Any]) -> dict[str, str]:
    """The texts of agent.yaml and the unit that ``props`` name: as given, or, where they keep a digest (the
    outputs), rendered again from them when that gives the digest kept (a text an earlier package rendered
    otherwise is known by its digest alone)."""
    out = {}
    for key in RENDERED_KEYS:
        value = props.get(key)
        if not isinstance(value, str):
            continue
        want = observed.digest_hex(value)
        text = whole(key, value, props) if want is None else _rendered(key, props)
        if text is not None and (want is None or desired.sha256_text(text) == want):
            out[key] = text
    return out


def wanted(props: Mapping[str, Any], installed_sha256: Any = None) -> Wanted:
    """What the node should hold as far as the inputs know it: agent.yaml and the unit while their text (or its
    digest) is known, the binary installed last (``installed_sha256``; a preview cannot know a new release's
    digest), and the unit running and enabled."""
    kept = digested(props)
    files = {f.path: observed.wanted_file(f, sha) for key, f in TEXT_FILES_BY_INPUT.items()
             if (sha := observed.digest_hex(kept.get(key))) is not None}
    if isinstance(installed_sha256, str) and installed_sha256:
        files[BINARY_FILE.path] = observed.wanted_file(BINARY_FILE, installed_sha256)
    return Wanted(files, observed.UNIT_WANTED)


def says_what_is_wanted(node: facts.NodeFacts, key: str, wants: Mapping[str, Any]) -> bool:
    """Does the node's text file for input ``key`` (``agent_yaml``, ``unit``) say what ``wants[key]`` says, in
    the same or other words (see ``desired.equivalent``)?"""
    f = TEXT_FILES_BY_INPUT[key]
    have, want = node.texts.get(f.path), wants.get(key)
    return isinstance(have, str) and isinstance(want, str) and desired.equivalent(f.content, have, want)


def seen_on(node: facts.NodeFacts, wants: Mapping[str, Any]) -> Observed:
    """The agent's files and unit as a script printed them. A text file that says what ``wants`` says in other
    words (one the script wrote, adopted as it is) is recorded as reading as the text wanted: not drift."""
    reads_as = {f.path: desired.sha256_text(wants[key]) for key, f in TEXT_FILES_BY_INPUT.items()
                if node.texts.get(f.path) != wants.get(key) and says_what_is_wanted(node, key, wants)}
    return observed.from_facts(node, FILES, reads_as, unit=True)


def drift(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """What the node was last seen holding that differs from what it should (``observed.differences``)."""
    seen = Observed.parse(olds.get(OBSERVED_KEY))
    return [f"{OBSERVED_KEY}.{d.path}" for d in observed.differences(wanted(news, olds.get("installed_sha256")), seen)]


def changed_inputs(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """The inputs that changed, the texts compared by their digests (the outputs keep no more of them). A local
    build is compared by its sha256: where it lies on the machine running Pulumi is no change to the node."""
    found = base.changed_keys(digested(olds), digested(news), INPUT_KEYS)
    same_build = isinstance(news.get("binary_sha256"), str) and olds.get("binary_sha256") == news["binary_sha256"]
    return [k for k in found if not (k == "binary_path" and same_build)]


def changes(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """Changed inputs, and drift. A record of an earlier version of the package is read through its migration
    (``observed.migrate``): it is no change."""
    current = _migrated(olds)
    return changed_inputs(current, news) + drift(current, news)


def binary_wanted(spec: AgentSpec, olds: Mapping[str, Any], changed: frozenset[str]) -> plan.BinaryWanted:
    """Where the binary comes from, and the sha256 it must have: the one installed last while the binary's inputs
    are the same, else a release's as approved here (once per process) or the local build's."""
    source = plan.Do.COPY if not spec.binary.is_release else plan.Do.PUSH if spec.binary.fetched_here else plan.Do.FETCH
    installed, arch = olds.get("installed_sha256"), olds.get("arch")
    if not {"version", "binary_sha256", "binary_path", "release_url"} & changed and installed and arch:
        return plan.BinaryWanted(source, {"" if source is plan.Do.COPY else arch: installed}, spec.binary.version)
    if source is plan.Do.COPY:
        return plan.BinaryWanted(source, {"": spec.binary.binary_sha256 or _sha256(_local_build(spec))})
    digests = dict(spec.binary.release_sha256 or approval.approve(release_of(spec.binary)))
    return plan.BinaryWanted(source, digests, spec.binary.version)


def fetch_line(spec: AgentSpec) -> str:
    """Where a release's binary comes from, said as the node's install begins: a debug diagnostic under its
    AgentInstall (`pulumi up --debug`, the event log), not an info line printed on each of a fleet's rows; the
    release and how its sha256 was approved are said once per run, under the stack (program.agent_inputs)."""
    return (f"{spec.node_id}: {'this machine downloads (and pushes)' if spec.binary.fetched_here else 'the node fetches'}"
            f" llmgw {spec.binary.version} from {spec.binary.release_url} and verifies it against the sha256 approved"
            " on this machine")


def _local_build(spec: AgentSpec) -> bytes:
    path = Path(spec.binary.binary_path or "")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(spec.node_id, "binary_path", f"cannot read the local binary {path}: {exc.strerror}",
                          "build llmgw there, or point agent.binary at the build") from None


def _streamed(spec: AgentSpec, path: Path) -> commands.StdinFile:
    """The binary at ``path`` as the script's stdin: streamed from disk as it is sent (a release of any size takes
    one chunk of memory); the node checks its size and sha256 before anything is installed."""
    try:
        return commands.StdinFile(str(path), path.stat().st_size)
    except OSError as exc:
        raise ConfigError(spec.node_id, "binary_path", f"cannot read the binary {path}: {exc.strerror}",
                          "build llmgw there, or point agent.binary at the build") from None


def _script(spec: AgentSpec, props: Mapping[str, Any], change: plan.Plan) -> commands.Script:
    """The plan as the script that carries it out, with the binary's bytes where it is pushed or copied."""
    step = change.step(BINARY_FILE.path)
    binary = None
    if step.do is plan.Do.COPY:
        binary = _streamed(spec, Path(spec.binary.binary_path or ""))
    elif step.do is plan.Do.PUSH:
        binary = _streamed(spec, approval.fetch_binary_file(release_of(spec.binary), change.arch, step.want.sha256))
    texts = texts_of(props)
    return commands.install_agent(change, texts["agent_yaml"], texts["unit"], version=spec.binary.version,
                                release_url=spec.binary.release_url or "", binary=binary)


def _survey(s: Any, spec: AgentSpec, props: Mapping[str, Any]) -> tuple[Observed, str]:
    res = s.run(commands.survey(FILES, TEXT_FILES))
    base.raise_for(res, spec.node_id, f"reading the agent's files on {spec.connection.host}")
    node = facts.parse_survey(res.stdout)
    return seen_on(node, texts_of(props)), node.arch


def _install(spec: AgentSpec, props: Mapping[str, Any], known: tuple[str | None, Any], binary: plan.BinaryWanted,
             seen: tuple[Observed, str] | None, changed: frozenset[str], gate: Callable[[plan.Plan | None], Any]) -> dict[str, Any]:
    """Plan the agent's change (llmgw_pulumi.nodestate.plan) and carry it out over one session. ``seen``: what the node
    was last seen holding, and its architecture; None (a create), or a plan the node finds stale: the node is
    read first. ``gate(plan)``: the rollout's context for a plan (None: not known before the node is read)."""
    want = wanted(props)
    change = plan.agent_plan(spec.node_id, want, *seen, binary, changed) if seen else None
    # The gate is the first plan's; what it reports is the outcome, so the error is raised inside it.
    with gate(change), base.session(spec.connection, spec.node_id, *known) as s:
        def run(seen: tuple[Observed, str]) -> commands.Result:
            change = plan.agent_plan(spec.node_id, want, *seen, binary, changed)
            if change.step(BINARY_FILE.path).do in (plan.Do.FETCH, plan.Do.PUSH):
                log.debug("%s", fetch_line(spec))  # the node's turn has come: after any rollout wait
            log.debug("%s", plan.render(change))
            return s.run(_script(spec, props, change))

        res = base.run_fresh(spec.node_id, seen, lambda: _survey(s, spec, props), run)
        base.raise_for(res, spec.node_id, f"installing the agent on {spec.connection.host}")
    node = facts.parse_survey(res.stdout)
    return {
        "installed_sha256": node.sha256(desired.BINARY_PATH) or "",
        "arch": node.arch,
        OBSERVED_KEY: seen_on(node, texts_of(props)).record(),
        VERSION_KEY: STATE_VERSION,
    }


def release_of(binary: BinarySource) -> approval.Release:
    """The release a binary source names, as llmgw_pulumi.releases.approval approves it."""
    return approval.Release(binary.release_url or "", binary.version, binary.signing_key, ca_file=binary.release_ca)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rollout_of(props: dict[str, Any]) -> NodeRollout | None:
    """The ``rollout`` input (the node's share of llmgw:rollout, ``specs.NodeRollout``), when there is one."""
    given = props.get("rollout")
    if not isinstance(given, dict) or is_unknown(given):
        return None
    built: NodeRollout = build(NodeRollout, given)
    return built


def with_approved_digests(olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """A preview's inputs (which leave the digests out: it fetches nothing) with the digests approved for the same
    release at the last `up`, so that `preview --diff` does not show them as removed."""
    if news.get("release_sha256") is not None or not olds.get("release_sha256"):
        return news
    if any(is_unknown(news.get(k)) or base.normalise(news.get(k)) != base.normalise(olds.get(k))
           for k in ("version", "release_url")):
        return news
    return {**news, "release_sha256": olds["release_sha256"]}


def _outputs(props: dict[str, Any], computed: dict[str, Any]) -> dict[str, Any]:
    """The inputs but RELEASE_KEYS, the texts as their digests, and what the operation found."""
    return base.outputs(digested({k: v for k, v in props.items() if k not in RELEASE_KEYS}), **computed)


def _migrated(props: Mapping[str, Any]) -> dict[str, Any]:
    return observed.migrate(props, desired.AGENT)


def carry_version(olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """``news`` with the version of the local build recorded last when a preview left it empty.

    A preview reads and hashes a local build but never runs it (program.local_binary): the pull request under
    review may have put it there. The same sha256 as recorded is the same build, so the same version: no change.
    Another build keeps its version empty (the diff and the summary show its sha256 changed) until `pulumi up`
    runs it to learn it.
    """
    sha = news.get("binary_sha256")
    if news.get("version") == "" and news.get("binary_path") and isinstance(sha, str) \
            and olds.get("binary_sha256") == sha and isinstance(olds.get("version"), str) and olds["version"]:
        return {**news, "version": olds["version"]}
    return news


class AgentInstallProvider(base.ModuleProvider):

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return base.check(with_approved_digests(olds, carry_version(olds, news)), AgentSpec.collect, derive=derive, olds=olds,
                           machine_facts=("hostname", "known_host_key", "known_jump_host_keys"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A replacement is created before the old one is deleted; the delete
        # leaves the node alone once agent.yaml names another node id.
        # ``rollout`` is not among INPUT_KEYS: how updates are spread is never a change to a node.
        found = changes(olds, news)
        if not found and isinstance(news.get("node_id"), str):
            rollout.unchanged(rollout_of(news), news["node_id"])
        return base.diff_result(found, REPLACE_KEYS)

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = AgentSpec.from_props(props)
        binary = binary_wanted(spec, {}, frozenset())

        def gate(_: plan.Plan | None) -> Any:
            return rollout.onboarding(spec.rollout, spec.node_id)  # first-time onboarding never waits

        computed = _install(spec, props, base.known_keys(props), binary, None, frozenset(), gate)
        _registration.confirm(spec.node_id, spec.registration)  # the agent started: the control plane lists it
        return CreateResult(spec.node_id, _outputs(props, computed))

    @base.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        operator_side = decisions.operator_side_only(changes(olds, news))
        olds = _migrated(olds)
        if operator_side:
            rollout.unchanged(rollout_of(news), str(news.get("node_id")))
            return UpdateResult(_outputs(news, {k: olds.get(k) for k in OUTPUT_KEYS}))
        spec = AgentSpec.from_props(news)
        changed = frozenset(changed_inputs(olds, news))
        last = Observed.parse(olds.get(OBSERVED_KEY))
        seen = (last, str(olds["arch"])) if last is not None and olds.get("arch") else None

        def gate(change: plan.Plan | None) -> Any:
            # A running agent is restarted: canaries first, at most maxParallel at once, none after a failure.
            if change is None or change.unit is plan.Unit.RESTART:
                return rollout.update(spec.rollout, spec.node_id)
            rollout.unchanged(spec.rollout, spec.node_id)
            return contextlib.nullcontext()

        computed = _install(spec, news, base.known_keys(news, olds), binary_wanted(spec, olds, changed), seen,
                            changed, gate)
        _registration.confirm(spec.node_id, spec.registration)  # the agent (re)started: the control plane lists it
        return UpdateResult(_outputs(news, computed))

    @base.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        props = _migrated(props)
        spec = AgentSpec.from_props(props)
        surveyed = base.survey_for_read(spec.connection, spec.node_id, base.known_keys(props), FILES, TEXT_FILES)
        if surveyed is None:
            return ReadResult(id_, props)  # an outage never rewrites the record
        node = surveyed.node
        texts = texts_of(props)
        seen = seen_on(node, texts)
        found = observed.differences(wanted(props, props.get("installed_sha256")), seen)
        # The text of agent.yaml as it is on the node, where it differs: the preview after a refresh shows it
        # against the text wanted, line by line (the unit by its digest); the rest of the drift by path.
        differ = {d.path for d in found if d.what in ("content", "absent")}
        on_node = {key: node.texts.get(f.path, "") if f.path in differ else None for key, f in TEXT_FILES_BY_INPUT.items()}
        if on_node["unit"] is not None:
            on_node["unit"] = observed.text_digest(on_node["unit"])
        if found and on_node["agent_yaml"] is None:
            on_node["agent_yaml"] = texts.get("agent_yaml")  # the inputs the preview compares hold the text
        if on_node["agent_yaml"] is not None:
            on_node["agent_yaml"] = desired.agent_yaml_input(spec.node_id, on_node["agent_yaml"])
        return base.read_result(id_, props, OUTPUT_KEYS, {**props, OBSERVED_KEY: seen.record()},
                                 {**on_node, "drift": observed.by_path(found) or None})

    @base.operator_errors
    def delete(self, _id: str, props: dict[str, Any]) -> None:
        spec = AgentSpec.from_props(_migrated(props))
        base.remove_from_node(spec.connection, spec.node_id, base.known_keys(props), commands.remove_agent(spec.node_id),
                               "the agent")


PROVIDER = AgentInstallProvider()
"""The one instance every resource is registered with (``base.ModuleProvider``)."""


@dataclass
class AgentInstallArgs(base.OnboardedNodeArgs):
    hostname: pulumi.Input[str]
    """The node's hostname (NodeIdentity reads it): agent.yaml says node_id only when they differ."""
    settings: AgentSettings = field(metadata={"flatten": True})
    """What agent.yaml says; each of its fields is an input of its own (servers, mgmt_addr, ...)."""
    binary: BinarySource = field(metadata={"flatten": True})
    """Where /usr/local/bin/llmgw comes from; each of its fields is an input of its own (version, release_url, ...)."""
    rollout: pulumi.Input[NodeRollout] | None = None
    """This node's share of how updates of running agents are spread over the stack (llmgw_pulumi.rollout); never a
    change itself."""
    registration: pulumi.Input[RegistrationCheck] | None = None
    """What must list the node once its agent (re)started (llmgw_pulumi.config.registration): run after each create, and
    each update that reached the node; never a change itself."""


class AgentInstall(base.NodeResource, module=decisions.PACKAGE, name=decisions.AGENT):
    PROVIDER = AgentInstallProvider
    SHOWN_INPUTS = ("version", "agent_yaml", "unit")

    version: pulumi.Output[str]
    """The version installed: after a failed or refused update, still the one before."""
    agent_yaml: pulumi.Output[str]
    """agent.yaml: its text in a preview, its ``sha256:`` digest once installed (``observed.text_digest``)."""
    unit: pulumi.Output[str]
    """The unit's ``sha256:`` digest."""
    installed_sha256: pulumi.Output[str]
    arch: pulumi.Output[str]
    observed: pulumi.Output[dict[str, Any]]
    """What the node was last seen holding (llmgw_pulumi.nodestate.observed)."""
    state_version: pulumi.Output[int]

    def __init__(self, name: str, args: AgentInstallArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(*self.registration(name, args, opts))


OUTPUT_KEYS = AgentInstall.output_keys()

