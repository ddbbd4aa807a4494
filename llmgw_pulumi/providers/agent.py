"""AgentInstall: the llmgw binary, /etc/llmgw/agent.yaml and the llmgw-agent unit, running.

SPEC steps 5, 6 and 8. The rendered agent.yaml and unit are inputs (derived in
check, without touching the network), so `pulumi preview --diff` shows the
config text that will change. Changing settings rewrites the config atomically
and restarts the agent; changing the version installs the new binary (a
release must have the sha256 approved on the operator's side, see
llmgw_pulumi.release, and report its tag); nothing is re-issued.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult
from pulumi.output import Unknown

from .. import desired, facts, release, remote, rollout
from ..errors import ChecksumMismatchError, ConfigError
from ..specs import NODE_REPLACE_KEYS, AgentSettings, AgentSpec, BinarySource, Rollout, build, is_unknown, names, to_inputs
from . import _glue

SETTINGS_KEYS = ("node_id", *names(AgentSettings))
"""The inputs agent.yaml is rendered from: the node id and AgentSettings' fields, each an input of its own."""
BINARY_KEYS = tuple(name for name in names(BinarySource) if name not in BinarySource.RELEASE_FIELDS)
RELEASE_KEYS = BinarySource.RELEASE_FIELDS
"""How a release is verified and carried: inputs only (used by create and update), never compared by the diff (a
preview fetches nothing, so it cannot know the digests) and not repeated in the outputs."""
INPUT_KEYS = ("connection", "known_host_key", "known_jump_host_keys", "hostname", *SETTINGS_KEYS, *BINARY_KEYS,
              "agent_yaml", "unit")
REPLACE_KEYS = NODE_REPLACE_KEYS
OUTPUT_KEYS = ("installed_sha256", "arch", "node_state")
log = logging.getLogger(__name__)
TEXT_FILES_BY_INPUT = {"agent_yaml": desired.file_with(desired.Content.AGENT_YAML, desired.AGENT),
                       "unit": desired.file_with(desired.Content.UNIT, desired.AGENT)}
"""The agent's text files, by the input that holds their text."""
TEXT_FILES = tuple(TEXT_FILES_BY_INPUT.values())


def derive(inputs: dict[str, Any]) -> None:
    """Render agent.yaml and the unit from the (validated) inputs, for the preview to show."""
    inputs["unit"] = desired.render_unit()
    relevant = [inputs.get(k) for k in ("hostname", *SETTINGS_KEYS)]
    if any(is_unknown(v) for v in relevant) or not isinstance(inputs.get("hostname"), str):
        inputs["agent_yaml"] = Unknown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        return
    inputs["agent_yaml"] = desired.render_agent_yaml(inputs["node_id"], AgentSettings.from_props(inputs), inputs["hostname"])


def _state_key(f: desired.NodeFile) -> str:
    return f"{f.name}_sha256"


def node_state(node: facts.NodeFacts, wants: dict[str, Any]) -> dict[str, str]:
    """The ``node_state`` output: each of the agent's files as seen (its sha256, or what differs from the
    desired state), and the unit's state.

    ``wants``: the inputs holding the texts wanted (``agent_yaml``, ``unit``). A
    text file that says the same in other words (``desired.equivalent``: one
    the script wrote, adopted as it is) is recorded as the text wanted, so it
    is not seen as drift; one that says something else is recorded as it is.
    """
    state = {_state_key(f): node.state(f) for f in desired.files_of(desired.AGENT)}
    for key, f in TEXT_FILES_BY_INPUT.items():
        sha = node.sha256(f.path)
        if sha and says_what_is_wanted(node, key, wants):
            state[_state_key(f)] = state[_state_key(f)].replace(sha, desired.sha256_text(wants[key]), 1)
    return {**state, "active": node.unit_active, "enabled": node.unit_enabled}


def says_what_is_wanted(node: facts.NodeFacts, key: str, wants: dict[str, Any]) -> bool:
    """Does the node's text file for input ``key`` (``agent_yaml``, ``unit``) say what ``wants[key]`` says, in
    the same or other words (see ``desired.equivalent``)?"""
    f = TEXT_FILES_BY_INPUT[key]
    have, want = node.texts.get(f.path), wants.get(key)
    return isinstance(have, str) and isinstance(want, str) and desired.equivalent(f.content, have, want)


def equivalent_texts(node: facts.NodeFacts, wants: dict[str, Any]) -> tuple[desired.Content, ...]:
    """The agent's text files the node has in other words than ``wants`` (see ``desired.equivalent``): kept."""
    return tuple(f.content for key, f in TEXT_FILES_BY_INPUT.items()
                 if node.texts.get(f.path) != wants.get(key) and says_what_is_wanted(node, key, wants))


def drift(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """What `pulumi refresh` found different on the node from what was installed."""
    seen = olds.get("node_state")
    if not isinstance(seen, dict):
        return []
    want: dict[desired.Content, Any] = {desired.Content.BINARY: olds.get("installed_sha256")}
    for content, key in ((desired.Content.AGENT_YAML, "agent_yaml"), (desired.Content.UNIT, "unit")):
        if isinstance(news.get(key), str):
            want[content] = desired.sha256_text(news[key])
    out = [f"node_state.{f.name}" for f in desired.files_of(desired.AGENT)
           if f.content in want and seen.get(_state_key(f)) != want[f.content]]
    return out + [f"node_state.{key}" for key, want in desired.UNIT_STATE.items() if seen.get(key) != want]


def unchanged_texts(olds: dict[str, Any], news: dict[str, Any]) -> tuple[desired.Content, ...]:
    """The agent's text files an update leaves alone: the text wanted is the same, and the node was last seen
    holding it (or its equivalent, as adopted from the script)."""
    seen = olds.get("node_state") or {}
    return tuple(f.content for key, f in TEXT_FILES_BY_INPUT.items()
                 if isinstance(news.get(key), str) and olds.get(key) == news[key]
                 and seen.get(_state_key(f)) == desired.sha256_text(news[key]))


def _install(spec: AgentSpec, props: dict[str, Any], mode: str, known: tuple[str | None, Any],
             adopt: bool = False, keep: tuple[desired.Content, ...] = ()) -> dict[str, Any]:
    """Install the agent over one session. ``adopt`` (create): first read what the node has, and keep what
    already says what is wanted (a node onboarded by the script): the binary when its sha256 is the one wanted,
    agent.yaml and the unit when equivalent. A release's binary must have the sha256 approved on the operator's
    side for the node's architecture; the node compares it (install-agent.sh), and with ``fetch: operator`` the
    binary is downloaded here, once per architecture, and pushed."""
    binary, digests, source = b"", {}, None
    if mode == "copy":
        path = Path(spec.binary.binary_path or "")
        try:
            binary = path.read_bytes()
        except OSError as exc:
            raise ConfigError(spec.node_id, "binary_path", f"cannot read the local binary {path}: {exc.strerror}",
                              "build llmgw there, or point agent.binary at the build") from None
    if mode == "release":
        source = release_of(spec.binary)
        digests = dict(spec.binary.release_sha256 or release.approve(source))  # approved once per process otherwise
        log.info("%s: %s llmgw %s from %s and verifies it against the sha256 approved on this machine", spec.node_id,
                 "this machine downloads (and pushes)" if spec.binary.fetched_here else "the node fetches",
                 spec.binary.version, spec.binary.release_url)
    push = mode == "release" and spec.binary.fetched_here
    with _glue.session(spec.connection, spec.node_id, *known) as s:
        if adopt or push:
            res = s.run(remote.survey(desired.files_of(desired.AGENT), TEXT_FILES))
            _glue.raise_for(res, spec.node_id, f"reading the agent's files on {spec.connection.host}")
            before = facts.parse_survey(res.stdout)
            if adopt:
                keep = equivalent_texts(before, props)
            if mode == "copy" and before.sha256(desired.BINARY_PATH) == (spec.binary.binary_sha256 or _sha256(binary)):
                mode, binary = "keep", b""
            if push and source is not None:
                mode, binary = _pushed(spec, source, digests, before)
        script = remote.install_agent(
            mode=mode,
            config=props["agent_yaml"],
            unit=props["unit"],
            version=spec.binary.version,
            release_url=spec.binary.release_url or "",
            binary=binary,
            binary_sha256=spec.binary.binary_sha256 or (_sha256(binary) if mode == "push" else ""),
            release_sha256=digests,
            keep=keep,
        )
        res = s.run(script)
    _glue.raise_for(res, spec.node_id, f"installing the agent on {spec.connection.host}")
    node = facts.parse_survey(res.stdout)
    return {
        "installed_sha256": node.sha256(desired.BINARY_PATH) or "",
        "arch": node.arch,
        "node_state": node_state(node, props),
    }


def release_of(binary: BinarySource) -> release.Release:
    """The release a binary source names, as llmgw_pulumi.release approves it."""
    return release.Release(binary.release_url or "", binary.version, binary.signing_key, ca_file=binary.release_ca)


def _pushed(spec: AgentSpec, source: release.Release, digests: dict[str, str], node: facts.NodeFacts) -> tuple[str, bytes]:
    """fetch: operator: (mode, bytes) for a node whose files are ``node``: ``keep`` when it has the approved
    binary for its architecture already, else ``push`` with the binary downloaded and verified here."""
    want = digests.get(node.arch)
    if want is None:
        raise ChecksumMismatchError(spec.node_id, f"checksums.txt of {spec.binary.version} has no line for "
                                    f"{release.binary_name(spec.binary.version, node.arch)} (or agent.sha256 no "
                                    f"{node.arch} digest); nothing was installed",
                                    "publish the release for this node's architecture, or pin its sha256")
    if node.sha256(desired.BINARY_PATH) == want:
        return "keep", b""
    return "push", release.fetch_binary(source, node.arch, want)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rollout_plan(props: dict[str, Any]) -> Rollout | None:
    """The ``rollout`` input (llmgw:rollout, with the stack's coordination directory), when there is one."""
    plan = props.get("rollout")
    if not isinstance(plan, dict) or is_unknown(plan):
        return None
    built: Rollout = build(Rollout, plan)
    return built


def _outputs(props: dict[str, Any], computed: dict[str, Any]) -> dict[str, Any]:
    """The inputs but RELEASE_KEYS, and what the operation found."""
    return _glue.outputs({k: v for k, v in props.items() if k not in RELEASE_KEYS}, **computed)


def _mode(spec: AgentSpec) -> str:
    return "release" if spec.binary.is_release else "copy"


class AgentInstallProvider(ResourceProvider):
    # Pickled by reference (module + class name): the payload holds nothing secret.
    serialize_as_secret_always = False

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return _glue.check(news, AgentSpec.collect, derive=derive, olds=olds,
                           machine_facts=("hostname", "known_host_key", "known_jump_host_keys"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A replacement is created before the old one is deleted; the delete
        # leaves the node alone once agent.yaml names another node id.
        # ``rollout`` is not among INPUT_KEYS: how updates are spread is never a change to a node.
        changes = _glue.changed_keys(olds, news, INPUT_KEYS) + drift(olds, news)
        if not changes and isinstance(news.get("node_id"), str):
            rollout.unchanged(rollout_plan(news), news["node_id"])
        return _glue.diff_result(changes, REPLACE_KEYS)

    @_glue.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = AgentSpec.from_props(props)
        with rollout.onboarding(spec.rollout, spec.node_id):  # first-time onboarding never waits
            computed = _install(spec, props, _mode(spec), _glue.known_keys(props), adopt=True)
        return CreateResult(spec.node_id, _outputs(props, computed))

    @_glue.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if _glue.operator_side_only(_glue.changed_keys(olds, news, INPUT_KEYS) + drift(olds, news)):
            rollout.unchanged(rollout_plan(news), str(news.get("node_id")))
            return UpdateResult(_outputs(news, {k: olds.get(k) for k in OUTPUT_KEYS}))
        spec = AgentSpec.from_props(news)
        binary_changed = any(_glue.normalise(olds.get(k)) != _glue.normalise(news.get(k)) for k in ("version", "binary_sha256"))
        binary_drifted = "node_state.binary" in drift(olds, news)
        mode = _mode(spec) if binary_changed or binary_drifted else "keep"
        # A running agent is restarted: canaries first, at most maxParallel at once, none after a failure.
        with rollout.update(spec.rollout, spec.node_id):
            computed = _install(spec, news, mode, _glue.known_keys(news, olds), keep=unchanged_texts(olds, news))
        return UpdateResult(_outputs(news, computed))

    @_glue.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        spec = AgentSpec.from_props(props)
        seen = _glue.survey_for_read(spec.connection, spec.node_id, _glue.known_keys(props),
                                     desired.files_of(desired.AGENT), TEXT_FILES)
        if seen is None:
            return ReadResult(id_, props)  # an outage never rewrites the record
        node = seen.node
        # The text of agent.yaml and the unit as they are on the node: the preview after a refresh
        # shows it against the text wanted, line by line.
        texts = {key: node.texts.get(f.path, "") for key, f in TEXT_FILES_BY_INPUT.items()}
        state = node_state(node, props)
        before = props.get("node_state") or {}
        paths = {_state_key(f): f.path for f in desired.files_of(desired.AGENT)}  # drift by path, as the operator knows it
        drift = {paths.get(k, f"unit {k}"): v for k, v in state.items() if v != before.get(k)}
        on_node = {key: None if says_what_is_wanted(node, key, props) else text for key, text in texts.items()}
        return _glue.read_result(id_, props, OUTPUT_KEYS, {**props, "node_state": state},
                                 {**on_node, "drift": drift or None})

    @_glue.operator_errors
    def delete(self, _id: str, props: dict[str, Any]) -> None:
        spec = AgentSpec.from_props(props)
        _glue.remove_from_node(spec.connection, spec.node_id, _glue.known_keys(props), remote.remove_agent(spec.node_id),
                               "the agent")


@dataclass
class AgentInstallArgs(_glue.OnboardedNodeArgs):
    hostname: pulumi.Input[str]
    """The node's hostname (NodeIdentity reads it): agent.yaml says node_id only when they differ."""
    settings: AgentSettings = field(metadata={"flatten": True})
    """What agent.yaml says; each of its fields is an input of its own (servers, mgmt_addr, ...)."""
    binary: BinarySource = field(metadata={"flatten": True})
    """Where /usr/local/bin/llmgw comes from; each of its fields is an input of its own (version, release_url, ...)."""
    rollout: Rollout | None = None
    """How updates of running agents are spread over the stack (llmgw_pulumi.rollout); never a change itself."""


class AgentInstall(Resource, module="llmgw", name="AgentInstall"):
    version: pulumi.Output[str]
    """The version installed: after a failed or refused update, still the one before."""
    agent_yaml: pulumi.Output[str]
    unit: pulumi.Output[str]
    installed_sha256: pulumi.Output[str]
    arch: pulumi.Output[str]
    node_state: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: AgentInstallArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = {**to_inputs(args), "agent_yaml": None, "unit": None, **{k: None for k in OUTPUT_KEYS}}
        super().__init__(AgentInstallProvider(), name, _glue.with_urn(type(self), name, props, opts), opts)

