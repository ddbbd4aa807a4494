"""What the providers decide about a change, declared once for them and for the review of a preview (pure).

The providers (llmgw_pulumi.providers) make these decisions when they run; the review
(llmgw_pulumi.preview.changes) reads a preview's JSON and says what the providers will do. Both call what
is here, so the summary of a pull request cannot say something the `up` then does not do:

- the type tokens of the resources, as the preview's URNs carry them;
- whether the same machine gets a new client certificate, and why (``reissue``);
- which inputs concern only how the operator's side reaches a node (a change to them alone updates the
  record and reaches no node), and which never touch the node at all (``touches_node``);
- that a refresh could not read a node: a warning that ends with ``UNREADABLE_MARK``
  (``unreadable_warning``, read back by ``unreadable_reason``), not a phrase to search for.

It imports nothing but the standard library and llmgw_pulumi.config.specs' defaults.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config.specs import DEFAULT_RENEW_BEFORE_HOURS, KEY_ORIGIN_NODE

# --------------------------------------------------------------------------- type tokens

PACKAGE = "llmgw"
"""The package's name in Pulumi: the module of every type token below."""
NODE_TYPE = f"{PACKAGE}:index:Node"
"""The type token of the Node component (llmgw_pulumi.stack.node, llmgw_pulumi.stack.component)."""
CERTIFICATE, IDENTITY, AGENT, ENGINES = "ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck"
"""The names of the four dynamic resources (llmgw_pulumi.providers); their type is
``pulumi-python:dynamic/llmgw:<name>``."""

# --------------------------------------------------------------------------- re-issuing a certificate

EXPIRES, CA_CHANGED, KEY_LOST, KEY_ORIGIN_CHANGED = "not_after", "ca_fingerprint", "node_key", "key_origin"
"""Why the same machine gets a new certificate, each named after the recorded value it is decided from."""
REASONS = (EXPIRES, CA_CHANGED, KEY_LOST, KEY_ORIGIN_CHANGED)
"""Every reason, in the order ``reissue`` gives them."""
NODE_KEY_HELD = "held"
"""ClientCertificate's ``node_key`` output when the node holds the certificate's key (keyOrigin node)."""


@dataclass(frozen=True)
class Reissue:
    """Whether the machine already known gets a new certificate (true when it does), and why (``REASONS``)."""

    reasons: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.reasons)


def _time(value: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def renewal_due(recorded: Mapping[str, Any], wanted: Mapping[str, Any], now: dt.datetime) -> bool:
    """The recorded certificate is inside its renewal window (``renew_before_hours``, by default
    DEFAULT_RENEW_BEFORE_HOURS), unless it already ends with its CA: a new one could not last longer."""
    not_after, ca_not_after = _time(recorded.get("not_after")), _time(recorded.get("ca_not_after"))
    before = wanted.get("renew_before_hours", DEFAULT_RENEW_BEFORE_HOURS)
    if not_after is None or isinstance(before, bool) or not isinstance(before, (int, float)):
        return False  # nothing recorded yet, or the window not known yet (a preview)
    if ca_not_after is not None and not_after >= ca_not_after:
        return False
    return not_after - dt.timedelta(hours=before) <= now


def reissue(recorded: Mapping[str, Any], wanted: Mapping[str, Any], now: dt.datetime) -> Reissue:
    """Whether the machine already known needs a new certificate, and why.

    ``recorded``: the ClientCertificate's recorded outputs (which hold its inputs too); ``wanted``: its new
    inputs, as check made them. A new node id or another machine is a replacement, decided apart (its
    REPLACE_KEYS); everything here is an update in place, which expects the host keys recorded.
    """
    reasons = []
    if renewal_due(recorded, wanted, now):
        reasons.append(EXPIRES)
    old_ca, new_ca = recorded.get("ca_fingerprint"), wanted.get("ca_fingerprint")
    if old_ca and new_ca and old_ca != new_ca:
        reasons.append(CA_CHANGED)
    if wanted.get("key_origin", KEY_ORIGIN_NODE) == KEY_ORIGIN_NODE \
            and recorded.get("node_key") not in (None, NODE_KEY_HELD):
        reasons.append(KEY_LOST)
    if recorded.get("key_origin", KEY_ORIGIN_NODE) != wanted.get("key_origin", KEY_ORIGIN_NODE):
        reasons.append(KEY_ORIGIN_CHANGED)
    return Reissue(tuple(reasons))


# --------------------------------------------------------------------------- what touches the node

OPERATOR_SIDE = frozenset({
    "connection.user", "connection.wait", "connection.jump", "connection.private_key", "connection.private_key_path",
    "connection.passphrase", "known_jump_host_keys",
})
"""Inputs that concern only how the operator's side reaches the node (a connection's field as
``connection.<field>``). A change to them alone updates the record, so the next operation uses them, and
reaches no node: the agent does not restart."""
NOT_NODE_CHANGES = frozenset({
    "__provider", "__urn", "pki_dir", "signer", "rollout", "release_sha256", "signing_key", "release_ca", "fetch",
    "allow_unverified_release", "verification", "ca_key_passphrase", "registration", "drift",
})
"""Inputs whose change alone does not touch the node: how certificates are signed, how a release is verified and
carried, how updates are spread, what must list the node once its agent started, what a refresh found (``drift``:
the paths it names are the change). ``__urn`` is what stacks of earlier versions recorded."""


def operator_side_only(changes: Iterable[str]) -> bool:
    """Do these changed inputs (``connection.<field>`` for a connection's) concern only the operator's side?"""
    changes = set(changes)
    return bool(changes) and changes <= OPERATOR_SIDE


def touches_node(changes: Iterable[str]) -> bool:
    """Does one of these changed inputs (or drifted paths) change what the node holds or runs?"""
    return any(c not in NOT_NODE_CHANGES and c not in OPERATOR_SIDE for c in changes)


# --------------------------------------------------------------------------- a node a refresh could not read

UNREADABLE_MARK = "[llmgw:unreadable]"
"""How a warning says that a read (a refresh) could not reach its node and kept its record: its last word."""


def unreadable_warning(reason: str) -> str:
    """The warning of a read that could not reach its node: ``reason`` (the node and why), then the mark."""
    return f"{reason}; its state is kept as it was {UNREADABLE_MARK}"


def unreadable_reason(message: str) -> str | None:
    """What an ``unreadable_warning`` says, without its mark; None for any other message."""
    text = message.rstrip()
    if not text.endswith(UNREADABLE_MARK):
        return None
    return text.removesuffix(UNREADABLE_MARK).rstrip()
