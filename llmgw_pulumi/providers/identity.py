"""NodeIdentity: the node's certificate, key and CA root in /etc/llmgw, and the root as a trust anchor.

SPEC steps 1, 3 and 4. It is also where the node is first reached: the host key
seen on first use is recorded as the ``host_key`` output, and the node's
hostname and architecture are recorded for AgentInstall.

With ``keyOrigin: operator`` the node's private key travels in the install
script's stdin. It is only ever sent to a machine whose host key is pinned
(``hostKey``) or already recorded: never on a first contact trusted on first
use, where it would go to whichever machine answered (``operator_key_unguarded``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from .. import decisions, errors
from ..config.schema import defaults
from ..config.specs import (
    KEY_ORIGIN_NODE,
    KEY_ORIGIN_OPERATOR,
    NODE_REPLACE_KEYS,
    CertificateSpec,
    Connection,
    IdentitySpec,
    Problems,
    is_unknown,
)
from ..nodestate import commands, desired, facts, observed, plan
from ..nodestate.observed import ANY, OBSERVED_KEY, STATE_VERSION, VERSION_KEY, Observed, Want, Wanted
from . import base

INPUT_KEYS = ("node_id", "connection", "ca_pem", "cert_pem", "key_pem", "key_origin")
REPLACE_KEYS = NODE_REPLACE_KEYS
PEM_KEYS = ("ca_pem", "cert_pem", "key_pem")
FILES = desired.files_of(desired.IDENTITY)
KEY_FILE = desired.file_with(desired.Content.KEY_PEM, desired.IDENTITY)


def key_on_node(props: Mapping[str, Any]) -> bool:
    return bool(props.get("key_origin", KEY_ORIGIN_NODE) == KEY_ORIGIN_NODE)


def wanted(props: Mapping[str, Any]) -> Wanted | None:
    """What the node should hold, or None while a PEM is unknown (preview). With the key made on the node its
    bytes are never seen here: the key file only has to be there, with its mode and owner."""
    on_node = key_on_node(props)
    ca, cert, key = props.get("ca_pem"), props.get("cert_pem"), None if on_node else props.get("key_pem")
    if not isinstance(ca, str) or not isinstance(cert, str) or not (on_node or isinstance(key, str)):
        return None
    want = {f.path: Want(f.sha256, f.mode, f.owner) for f in desired.identity_files(ca, cert, key)}
    if on_node:
        want[KEY_FILE.path] = Want(ANY, KEY_FILE.mode, KEY_FILE.owner)
    return Wanted(want)


def recorded_keys(props: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The host keys to expect: those this resource recorded (its outputs ``host_key`` and ``jump_host_keys``),
    else those ClientCertificate recorded when it had the node make its key (``known_*``)."""
    return (props.get("host_key") or props.get("known_host_key"),
            props.get("jump_host_keys") or props.get("known_jump_host_keys"))


OPERATOR_KEY_UNGUARDED = (
    "keyOrigin operator sends the node's private key over SSH, and no host key is pinned or recorded for this "
    "machine: the key would go to whichever machine answers at its address",
    "pin the node's hostKey (ConnectionArgs.host_key), read on the machine itself, not over the network: "
    "`cat /etc/ssh/ssh_host_ed25519_key.pub` on its console, or the key its image or provisioning system gave it; "
    "or leave keyOrigin at node (the default): that key never leaves the node")
"""The problem and fix of an operator-made key about to be sent to a machine nobody vouched for."""


def operator_key_unguarded(sends_key: bool, pin: Any, recorded: Mapping[str, Any]) -> bool:
    """Would an operator-made key (``sends_key``) go to a machine that neither a pinned host key (``pin``) nor one
    recorded (``recorded``'s, see recorded_keys) vouches for?"""
    return sends_key and pin is None and recorded_keys(recorded)[0] is None


def _apply(spec: IdentitySpec, props: Mapping[str, Any], recorded: Mapping[str, Any],
           seen: Observed | None) -> dict[str, Any]:
    """Plan and carry out the identity's change (llmgw_pulumi.nodestate.plan) over one session. ``seen``: what the node
    was last seen holding; None (a create), or a plan the node finds stale: the node is read first."""
    if operator_key_unguarded(spec.key_pem is not None, spec.connection.host_key, recorded):
        # Refused before any connection: nothing is sent, not even the session's first command.
        raise errors.ConfigError(spec.node_id, "hostKey", *OPERATOR_KEY_UNGUARDED)
    files = desired.identity_files(spec.ca_pem, spec.cert_pem, spec.key_pem)
    want = wanted(props)
    assert want is not None  # create and update get known PEMs
    spki = None
    if spec.key_pem is None:
        from ..certificates import pki  # cryptography: only to name the node's key by its public half

        spki = pki.spki_b64(spec.cert_pem)
    with base.session(spec.connection, spec.node_id, *recorded_keys(recorded)) as s:
        def survey() -> Observed:
            res = s.run(commands.survey(FILES))
            base.raise_for(res, spec.node_id, f"reading the identity's files on {spec.connection.host}")
            return observed.from_facts(facts.parse_survey(res.stdout), FILES)

        def run(seen: Observed) -> commands.Result:
            return s.run(commands.install_identity(plan.identity_plan(spec.node_id, want, seen, key_on_node(props)), files, spki))

        res = base.run_fresh(spec.node_id, seen, survey, run)
        base.raise_for(res, spec.node_id, f"installing the identity on {spec.connection.host}")
        node = facts.parse_survey(res.stdout)
        return {
            "host_key": s.host_key,
            "jump_host_keys": s.jump_host_keys,  # {} without jump hosts: a known value in every preview
            "hostname": node.hostname,
            "arch": node.arch,
            OBSERVED_KEY: observed.from_facts(node, FILES).record(),
            "trust": facts.key_values(res.stdout).get("trust", ""),
            VERSION_KEY: STATE_VERSION,
        }


def _recorded(outs: dict[str, Any]) -> dict[str, Any]:
    """Outputs as this resource records them: without the host key ClientCertificate recorded (``known_host_key``)
    once the key this resource saw is recorded (``host_key``): every later connection expects that one
    (``recorded_keys``), so the first is not repeated."""
    if outs.get("host_key"):
        outs.pop("known_host_key", None)
    return outs


def changes(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """Changed inputs, and drift: the node's files, as last seen, differ from what they should hold. A record of
    an earlier version of the package is read through its migration (``observed.migrate``): it is no change."""
    olds = _migrated(olds)
    found = base.changed_keys(olds, news, INPUT_KEYS)
    want = wanted(news)
    if want is not None and not set(PEM_KEYS) & set(found) and \
            observed.differences(want, Observed.parse(olds.get(OBSERVED_KEY))):
        found.append(OBSERVED_KEY)
    return found


class NodeIdentityProvider(base.ModuleProvider):

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        def collect(props: Mapping[str, Any], problems: Problems) -> None:
            IdentitySpec.collect(props, problems)
            # A resource that will be created (none yet, or another machine) has recorded nothing: say so in the
            # preview already. create() refuses in any case (a replacement the engine decides on, replace_with).
            conn = props.get("connection")
            if not isinstance(conn, Mapping) or is_unknown(conn.get("host_key")):
                return  # the pin is not known yet (a preview): create() decides
            new_machine = not olds or not base.same_machine(olds, props) or olds.get("node_id") != props.get("node_id")
            operator_key = props.get("key_origin") == KEY_ORIGIN_OPERATOR
            if new_machine and operator_key_unguarded(operator_key, conn.get("host_key"), props):
                problems.add("hostKey", *OPERATOR_KEY_UNGUARDED)

        # The host keys ClientCertificate recorded: the same while the machine is (it refuses another).
        return base.check(news, collect, defaults=defaults(CertificateSpec, ("key_origin",)), olds=olds,
                           machine_facts=("known_host_key", "known_jump_host_keys"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A replacement is created before the old one is deleted; the delete
        # leaves the node alone once it carries the replacement's certificate.
        return base.diff_result(changes(olds, news), REPLACE_KEYS)

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = IdentitySpec.from_props(props)
        computed = _apply(spec, props, props, None)
        return CreateResult(spec.node_id, _recorded(base.outputs(props, **computed)))

    @base.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        operator_side = decisions.operator_side_only(changes(olds, news))
        olds = _migrated(olds)
        if operator_side:
            return UpdateResult(_recorded(base.carried(olds, news, OUTPUT_KEYS)))
        spec = IdentitySpec.from_props(news)
        computed = _apply(spec, news, olds, Observed.parse(olds.get(OBSERVED_KEY)))
        return UpdateResult(_recorded(base.outputs(news, **computed)))

    @base.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        props = _migrated(props)
        spec = IdentitySpec.from_props(props)
        surveyed = base.survey_for_read(spec.connection, spec.node_id, recorded_keys(props), FILES)
        if surveyed is None:
            return ReadResult(id_, props)  # an outage never rewrites the record
        node = surveyed.node
        jump_host_keys = {**(props.get("jump_host_keys") or {}), **surveyed.jump_host_keys}
        seen = observed.from_facts(node, FILES)
        outs = _recorded(base.outputs({**props, OBSERVED_KEY: seen.record(), "hostname": node.hostname,
                                        "arch": node.arch}, jump_host_keys=jump_host_keys))
        drift = observed.by_path(observed.differences(wanted(props) or Wanted({}), seen))
        return base.read_result(id_, props, OUTPUT_KEYS, outs, {"drift": drift or None})

    @base.operator_errors
    def delete(self, _id: str, props: dict[str, Any]) -> None:
        props = _migrated(props)
        spec = IdentitySpec.from_props(props)
        # What this resource installed: a refresh may since have recorded another identity's files. The key made
        # on the node is the one last seen there.
        last = Observed.parse(props.get(OBSERVED_KEY)) or Observed({})
        shas = {path: want.sha256 if want.sha256 != ANY else last.sha256(path)
                for path, want in (wanted(props) or Wanted({})).files.items()}
        owned = {path: sha for path, sha in shas.items() if sha}
        base.remove_from_node(spec.connection, spec.node_id, recorded_keys(props),
                               commands.remove_identity(owned), "the identity")


PROVIDER = NodeIdentityProvider()
"""The one instance every resource is registered with (``base.ModuleProvider``)."""


def _migrated(props: Mapping[str, Any]) -> dict[str, Any]:
    return observed.migrate(props, desired.IDENTITY)


@dataclass
class NodeIdentityArgs:
    node_id: pulumi.Input[str]
    connection: Connection
    ca_pem: pulumi.Input[str]
    cert_pem: pulumi.Input[str]
    key_pem: pulumi.Input[str] | None = None
    """keyOrigin operator: the key ClientCertificate made. Absent with the key made on the node."""
    key_origin: pulumi.Input[str] | None = None
    """``node`` (the default) or ``operator``, as the node's ClientCertificate was given."""
    known_host_key: pulumi.Input[str] | None = None
    """The host key ClientCertificate saw when it had the node make its key (keyOrigin node): expected here."""
    known_jump_host_keys: pulumi.Input[dict[str, str]] | None = None


class NodeIdentity(base.NodeResource, module=decisions.PACKAGE, name=decisions.IDENTITY):
    PROVIDER = NodeIdentityProvider
    SECRET_OUTPUTS = ("key_pem",)

    host_key: pulumi.Output[str]
    jump_host_keys: pulumi.Output[dict[str, str]]
    """The key each jump host presented, by 'host:port': checked on every later connection."""
    hostname: pulumi.Output[str]
    arch: pulumi.Output[str]
    observed: pulumi.Output[dict[str, Any]]
    """What the node was last seen holding (llmgw_pulumi.nodestate.observed)."""
    trust: pulumi.Output[str]
    state_version: pulumi.Output[int]

    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(*self.registration(name, args, opts))


OUTPUT_KEYS = NodeIdentity.output_keys()
