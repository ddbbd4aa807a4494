"""What the providers decide about a change, declared once for them and for the review of a preview (pure).

The providers (llmgw_pulumi.providers) make these decisions when they run; the review
(llmgw_pulumi.fleet_review) reads a preview's JSON and says what the providers will do. Both call what
is here, so the summary of a pull request cannot say something the `up` then does not do:

- whether the same machine gets a new client certificate, and why (``reissue``).

It imports nothing but the standard library and llmgw_pulumi.specs' defaults.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .specs import DEFAULT_RENEW_BEFORE_HOURS, KEY_ORIGIN_NODE

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
