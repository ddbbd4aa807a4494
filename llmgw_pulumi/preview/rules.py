"""The fleet's rules, checked by the policy pack (llmgw_pulumi/policy, `pulumi preview --policy-pack`): pure.

Each rule takes plain data (a resource's inputs, the stack's config, the last
deployment's resources) and its parameters, and returns the violations, each a
message that names the node and says how to comply. The policy pack only wires
them to pulumi-policy; the names of the inputs read are the summary's
(``llmgw_pulumi.preview.changes``), kept in one place there.

The engine gives a policy pack the new state only: the rules that compare with
what is deployed (restarts, removals) get the last deployment's resources
from ``pulumi stack export``, which the pack runs (see its ``__main__.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..nodestate import observed
from ..releases import policy
from . import changes as fleet_review
from . import trust_roots

KEY_ORIGIN_OPERATOR = "operator"
HOST_KEY, VALIDITY_HOURS, SIGNING_KEY, BINARY_PATH = "host_key", "validity_hours", "signing_key", "binary_path"
RELEASE_SHA256 = "release_sha256"
NODE_ID = "node_id"


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    enforcement: str
    """The default enforcement level ("advisory", "mandatory" or "disabled"); the policy config file overrides it."""
    params: Mapping[str, tuple[str, Any, str]]
    """Parameter -> (JSON schema type, default, what it means)."""


HOST_KEYS_PINNED = Rule("host-keys-pinned", "Every node's SSH host key is pinned (hostKey), not trusted on first use.",
                        "advisory", {})
NO_OPERATOR_KEYS = Rule("no-operator-keys", "No node's key is made on the operator's side (keyOrigin: operator).",
                        "mandatory", {})
CERTIFICATE_VALIDITY = Rule("certificate-validity", "Client certificates are valid for at most maxHours.", "mandatory",
                            {"maxHours": ("number", 8760, "the longest validityHours allowed")})
RELEASE_VERIFIED = Rule("release-verified", "Every agent release is verified: by a signature or sha256 pins, as each "
                        "node's AgentInstall records it.", "mandatory",
                        {"allowDevBuild": ("boolean", False, "allow `agent.binary`, a local build copied as is"),
                         "allowUnverifiedRelease": ("boolean", False, "allow a release installed under "
                                                    "agent.allowUnverifiedRelease, verified by nothing")})
ROLLOUT_REQUIRED = Rule("rollout-required", "llmgw:rollout is set when more than maxRestarts running agents would restart.",
                        "mandatory", {"maxRestarts": ("integer", 1, "restarts allowed without a rollout")})
REMOVAL_ALLOWED = Rule("removal-allowed", "No node is removed unless its id is in the allowed list.", "mandatory",
                       {"allowed": ("array", [], "node ids that this change may remove")})
TRUST_ROOTS_UNCHANGED = Rule(
    "trust-roots-unchanged", "No trust root (release signing key or pins, release server or its CA, signer, CA, host "
    "key pins, jump hosts) changes unless the policy config allows the value it changes to.", "mandatory",
    {"allowed": ("array", [], 'the changes allowed, each {"setting": "agent.signingKey", "to": "<the new value as '
                 'the summary shows it>"}')})
RULES = (HOST_KEYS_PINNED, NO_OPERATOR_KEYS, CERTIFICATE_VALIDITY, RELEASE_VERIFIED, ROLLOUT_REQUIRED, REMOVAL_ALLOWED,
         TRUST_ROOTS_UNCHANGED)


def plain(value: Any, unknown: type[Exception]) -> Any:
    """A plain copy of the props the policy SDK gives a rule: its mappings and lists are proxies (not dicts and
    lists, so they never compare equal to the recorded ones), and reading a value the preview cannot know yet
    raises ``unknown``; such a value becomes ``fleet_review.UNKNOWN``."""
    def read(get: Any) -> Any:
        try:
            return plain(get(), unknown)
        except unknown:
            return fleet_review.UNKNOWN

    if isinstance(value, Mapping):
        return {key: read(lambda key=key: value[key]) for key in value}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [read(lambda i=i: value[i]) for i in range(len(value))]
    return value


def param(rule: Rule, config: Mapping[str, Any], name: str) -> Any:
    """A rule's parameter from its policy config, or its default."""
    return config.get(name, rule.params[name][1])


def _known(value: Any) -> bool:
    return value is not None and value != fleet_review.UNKNOWN and value != ""


# --------------------------------------------------------------------------- one resource at a time (its new inputs)


def host_key_pinned(kind: str, inputs: Mapping[str, Any]) -> str | None:
    if kind != fleet_review.IDENTITY:
        return None
    connection = inputs.get(fleet_review.CONNECTION)
    if isinstance(connection, Mapping) and _known(connection.get(HOST_KEY)):
        return None
    node = inputs.get(NODE_ID, "?")
    return (f"{node}: its SSH host key is not pinned, so the first key seen is trusted. "
            f"Pin it: set hostKey on node {node} in llmgw:nodes (`ssh-keyscan -t ed25519 ADDRESS`, checked against "
            "the machine's console, or the key `pulumi stack export` recorded for it)")


def no_operator_key(kind: str, inputs: Mapping[str, Any]) -> str | None:
    if kind != fleet_review.CERTIFICATE or inputs.get(fleet_review.KEY_ORIGIN) != KEY_ORIGIN_OPERATOR:
        return None
    node = inputs.get(NODE_ID, "?")
    return (f"{node}: keyOrigin: operator makes its private key here and keeps it in state. Remove keyOrigin from "
            f"node {node} in llmgw:nodes (the node makes its own key with openssl) or install openssl on it")


def certificate_validity(kind: str, inputs: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    hours, most = inputs.get(VALIDITY_HOURS), param(CERTIFICATE_VALIDITY, config, "maxHours")
    if kind != fleet_review.CERTIFICATE or not isinstance(hours, (int, float)) or hours <= most:
        return None
    node = inputs.get(NODE_ID, "?")
    return (f"{node}: its certificate would be valid for {hours:g} hours, more than the {most:g} this stack allows. "
            f"Set llmgw:certificate.validityHours (or the node's certificate.validityHours) to at most {most:g}")


def release_verified(kind: str, inputs: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """Judges the record the program makes of how each node's agent is verified (AgentInstall's ``verification``
    input: a signature or a pin passes; a local build and the opt-out only when the policy config allows them),
    whatever way the config was given: stack config, a node list file, component inputs or a program's own."""
    if kind != fleet_review.AGENT:
        return None
    node = str(inputs.get(NODE_ID, "?"))
    version = inputs.get(fleet_review.VERSION)
    record = inputs.get(fleet_review.VERIFICATION)
    if record == fleet_review.UNKNOWN:
        return None  # an Output of the program's own, not known before `up`: judged then
    backed = {policy.SIGNATURE: SIGNING_KEY, policy.PIN: RELEASE_SHA256,
              policy.LOCAL_BUILD: BINARY_PATH}
    if record in backed and not _known(inputs.get(backed[record])):
        return (f"{node}: its agent's verification is recorded as {record!r}, but its {backed[record]} is not given. "
                "Let the Node component record it (leave BinarySource.verification out)")
    if record in (policy.SIGNATURE, policy.PIN):
        return None
    if record == policy.LOCAL_BUILD:
        if param(RELEASE_VERIFIED, config, "allowDevBuild"):
            return None
        return (f"{node}: its agent is a local build (agent.binary), copied unverified. Deploy a release with "
                "agent.signingKey or agent.sha256, or allow dev builds in the policy config (allowDevBuild: true)")
    if record == policy.OPT_OUT:
        if param(RELEASE_VERIFIED, config, "allowUnverifiedRelease"):
            return None
        return (f"{node}: release {version} is installed from a checksums.txt nobody signed "
                f"(agent.{policy.OPT_OUT_SETTING}). Set llmgw:agent.signingKey (the release signing key) or "
                f"pin llmgw:agent.sha256 for {version}, or allow it in the policy config (allowUnverifiedRelease: true)")
    return (f"{node}: release {version} has no record of how it is verified ({fleet_review.VERIFICATION}: "
            f"{record!r}). Onboard it with this package's Node (it records a signature, a pin or the opt-out)")


def trust_roots_unchanged(kind: str, old: Mapping[str, Any] | None, new: Mapping[str, Any],
                          config: Mapping[str, Any]) -> list[str]:
    """A message for each trust root a resource changes, from its recorded inputs (``old``; None: a resource this
    change creates) to its new ones, that the policy config's allowed list does not approve."""
    if old is None:
        return []
    allowed = param(TRUST_ROOTS_UNCHANGED, config, "allowed") or []
    node = str(new.get(NODE_ID) or old.get(NODE_ID) or "?")
    return [f"{node}: {change.setting} changes from {change.old} to {change.new} "
            f"({trust_roots.SETTINGS[change.setting].what}). Nothing on the node changes, but every later `pulumi up` "
            f"trusts the new value. {_approve(change)}"
            for change in trust_roots.changes(kind, old, new) if not trust_roots.approved(change, allowed)]


def _approve(change: trust_roots.Change) -> str:
    """How to settle a trust-root change the allowed list does not approve."""
    if change.new == trust_roots.NOT_KNOWN:
        return ("No entry can approve a value the preview does not know: make it known where the preview runs (for "
                "ca: pkiDir's ca.pem readable there, as the CI examples copy stacks/ca.pem to it; otherwise a value "
                "given in the config, not another resource's output), then approve what it shows; or undo it")
    return ("If the change is meant, approve it in the base branch's policy config (its owner reviews it): add "
            f"{trust_roots.allow_entry(change)} to the trust-roots-unchanged rule's allowed list; otherwise undo it")


def stack_config_from_env(text: str | None) -> dict[str, Any]:
    """The stack's config as the language host passes it to a policy pack (PULUMI_CONFIG: values as JSON text)."""
    raw = json.loads(text) if text else {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            out[key] = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError:
            out[key] = value
    return out


# --------------------------------------------------------------------------- the stack against its last deployment


@dataclass(frozen=True)
class Resource:
    kind: str
    """``fleet_review.kind_of``: AgentInstall, Node, ..."""
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    output_only: frozenset[str] = frozenset()
    """Of a deployed resource: the names among its outputs that are not inputs (what the node reported)."""


def resources_of(deployment: Mapping[str, Any]) -> list[Resource]:
    """The resources of `pulumi stack export`'s ``deployment`` (their inputs)."""
    found = []
    for r in deployment.get("resources") or []:
        urn = r.get("urn")
        if isinstance(urn, str) and "::" in urn:
            inputs, outputs = r.get("inputs") or {}, r.get("outputs") or {}
            found.append(Resource(fleet_review.kind_of(urn), urn.split("::")[-1], inputs, urn, frozenset(outputs) - set(inputs)))
    return found


def restarting_agents(deployed: Iterable[Resource], planned: Iterable[Resource]) -> list[Resource]:
    """The planned AgentInstalls of running agents whose change restarts them.

    A planned resource's props are what the engine gives a stack policy: the new inputs of one that changes, the
    recorded outputs of one that does not (its inputs and what the node reported, left out of the comparison).
    """
    before = {r.name: r for r in deployed if r.kind == fleet_review.AGENT}
    restarting = []
    for r in planned:
        old = before.get(r.name)
        if r.kind != fleet_review.AGENT or old is None:
            continue
        new = {k: v for k, v in r.props.items() if k not in old.output_only}
        # An unchanged resource's props are its outputs, which keep agent.yaml and the unit as digests.
        if fleet_review.touches_node(fleet_review.changed_inputs(observed.digested(old.props), observed.digested(new))):
            restarting.append(r)
    return restarting


def rollout_required(deployed: Sequence[Resource], planned: Sequence[Resource], config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(urn, message) when more than maxRestarts agents restart and no llmgw:rollout governs them."""
    restarting = [r for r in restarting_agents(deployed, planned) if not isinstance(r.props.get(fleet_review.ROLLOUT), Mapping)]
    most = int(param(ROLLOUT_REQUIRED, config, "maxRestarts"))
    if len(restarting) <= most:
        return []
    names = ", ".join(sorted((r.name for r in restarting), key=fleet_review.natural))
    return [(r.urn, f"{r.name}: {len(restarting)} running agents would restart at once ({names}), more than the {most} "
             "this stack allows without a rollout. Set llmgw:rollout, e.g. {maxParallel: 2, canary: [" + restarting[0].name
             + "]}, so canaries go first and at most maxParallel restart at once") for r in restarting]


def removal_allowed(deployed: Sequence[Resource], planned: Sequence[Resource], config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(urn, message) for each node deployed, absent from the program, and not in the allowed list."""
    allowed = set(param(REMOVAL_ALLOWED, config, "allowed") or [])
    present = {r.name for r in planned if r.kind == fleet_review.NODE_TYPE}
    removed = sorted((r for r in deployed if r.kind == fleet_review.NODE_TYPE and r.name not in present and r.name not in allowed),
                     key=lambda r: fleet_review.natural(r.name))
    return [(r.urn, f"{r.name}: this change removes the node (its agent is stopped, its identity deleted). If that is "
             f"meant, add \"{r.name}\" to the removal-allowed rule's allowed list in the policy config; otherwise "
             f"put node {r.name} back in llmgw:nodes") for r in removed]
