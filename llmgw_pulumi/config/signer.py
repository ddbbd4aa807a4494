"""What a signer is asked and how ``llmgw:signer`` chooses one: pure data and decisions.

A signer gets a ``SigningRequest`` (the node id, the CSR PEM, the validity wanted; a signer command finds it in
its environment, the ``ENV_*`` names) and returns PEM text. ``SignerSpec`` is ``llmgw:signer`` as a
ClientCertificate's input, ``problems`` what is wrong with one. Running a signer command is in
``llmgw_pulumi.certificates.signer``, which re-exports every name here; signing with a CA key in ``llmgw_pulumi.certificates.signing``.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .. import validate
from ..text import printable
from .schema import setting

KIND_PKI_DIR, KIND_CA_KEY, KIND_COMMAND = "pkiDir", "caKey", "command"
KINDS = (KIND_PKI_DIR, KIND_CA_KEY, KIND_COMMAND)
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_PARALLEL = 4
CLOCK_SKEW = dt.timedelta(minutes=5)
"""A certificate starts this long before it is asked for (a node's clock may lag), and a signer may round its
validity by this much either way."""

# The environment a signer command gets (besides the one Pulumi runs in: e.g. the PIN of its token).
ENV_NODE_ID = "LLMGW_NODE_ID"
"""The node id: the certificate's subject is CN=<node id> and nothing else."""
ENV_SUBJECT = "LLMGW_SUBJECT"
"""The subject as openssl's -subj takes it: /CN=<node id>."""
ENV_NOT_BEFORE = "LLMGW_NOT_BEFORE"
ENV_NOT_AFTER = "LLMGW_NOT_AFTER"
"""The validity, ISO 8601 UTC (2026-12-01T10:00:00+00:00)."""
ENV_NOT_BEFORE_ASN1 = "LLMGW_NOT_BEFORE_ASN1"
ENV_NOT_AFTER_ASN1 = "LLMGW_NOT_AFTER_ASN1"
"""The validity as openssl ca -startdate/-enddate take it (YYYYMMDDHHMMSSZ)."""
ENV_VALIDITY_SECONDS = "LLMGW_VALIDITY_SECONDS"
"""From now to the end of the validity, whole seconds (e.g. Vault's ttl=<n>s, step's --not-after=<n>s)."""
ENV_SERIAL = "LLMGW_SERIAL"
"""A fresh random serial number, hex (for signers that need one given: openssl ca -set_serial 0x<serial>)."""
ENV_KEY_USAGE = "LLMGW_KEY_USAGE"
ENV_EXTENDED_KEY_USAGE = "LLMGW_EXTENDED_KEY_USAGE"
"""The usages wanted, as openssl spells them: digitalSignature, clientAuth."""
ENV_EXTENSIONS = "LLMGW_EXTENSIONS"
"""Every extension wanted, as the text of an openssl extfile (x509 -extfile, ca -extfile)."""

KEY_USAGE = "digitalSignature"
EXTENDED_KEY_USAGE = "clientAuth"
EXTENSIONS = (
    "basicConstraints = critical, CA:FALSE\n"
    f"keyUsage = critical, {KEY_USAGE}\n"
    f"extendedKeyUsage = {EXTENDED_KEY_USAGE}\n"
    "subjectKeyIdentifier = hash\n"
    "authorityKeyIdentifier = keyid\n"
)


@dataclass(frozen=True)
class SigningRequest:
    """What a signer is asked for: pure data."""

    node_id: str
    csr_pem: str
    not_before: dt.datetime
    not_after: dt.datetime

    def environment(self, now: dt.datetime) -> dict[str, str]:
        """What a signer command finds in its environment (the ENV_* names)."""
        return {
            ENV_NODE_ID: self.node_id,
            ENV_SUBJECT: f"/CN={self.node_id}",
            ENV_NOT_BEFORE: self.not_before.isoformat(),
            ENV_NOT_AFTER: self.not_after.isoformat(),
            ENV_NOT_BEFORE_ASN1: f"{self.not_before:%Y%m%d%H%M%SZ}",
            ENV_NOT_AFTER_ASN1: f"{self.not_after:%Y%m%d%H%M%SZ}",
            ENV_VALIDITY_SECONDS: str(max(1, int((self.not_after - now).total_seconds()))),
            ENV_SERIAL: secrets.token_hex(16),
            ENV_KEY_USAGE: KEY_USAGE,
            ENV_EXTENDED_KEY_USAGE: EXTENDED_KEY_USAGE,
            ENV_EXTENSIONS: EXTENSIONS,
        }


def request(node_id: str, csr_pem: str, validity: dt.timedelta, now: dt.datetime,
            ca_not_after: dt.datetime) -> SigningRequest:
    """The request for a certificate valid from shortly before ``now`` for ``validity``, capped at the CA's end."""
    return SigningRequest(node_id, csr_pem, (now - CLOCK_SKEW).replace(microsecond=0),
                          min(now + validity, ca_not_after).replace(microsecond=0))


class Signer(Protocol):
    def sign(self, req: SigningRequest) -> str:
        """The certificate PEM (or a chain starting with it) for ``req``; SignerError naming the node when not."""
        ...


def _kind(value: object) -> validate.Problem:
    if value not in KINDS:
        return f"{printable(str(value))!r} is not a signer", f"use one of {', '.join(KINDS)}"
    return None


def _ca(value: object) -> validate.Problem:
    if not isinstance(value, str) or "-----BEGIN CERTIFICATE-----" not in value:
        return ("is missing or not a PEM certificate",
                "give the CA certificate (ca.pem) as a path on this machine or as its PEM text")
    return None


def _command(value: object) -> validate.Problem:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) and a for a in value):
        return ("is not a list of arguments",
                "give the signer as an argv list, e.g. [/usr/local/bin/llmgw-sign, --profile, node]")
    if not os.path.isabs(value[0]):
        return (f"{printable(value[0])!r} is not an absolute path",
                "give the signer program's absolute path, so no $PATH decides which program signs")
    return None


def _timeout(value: object) -> validate.Problem:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3600:
        return "is not a number of seconds between 0 and 3600", "e.g. 60"
    return None


def _max_parallel(value: object) -> validate.Problem:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or int(value) != value or not 1 <= value <= 64:
        return "is not a whole number from 1 to 64", "e.g. 4"
    return None


@dataclass(frozen=True)
class SignerSpec:
    """How node certificates are signed: with the CA key in pkiDir (the default), with the CA key held as the
    secret llmgw:caKey, or by a program of yours.

    ``llmgw:signer`` in the stack config; a ClientCertificate's ``signer`` input, where ``ca_pem`` holds the
    certificate's text. It never holds a secret."""

    kind: str = setting("kind", _kind, default=KIND_PKI_DIR,
                        doc="pkiDir: ca.pem and ca-key.pem in pkiDir on this machine; caKey: the CA key held as the "
                            "secret llmgw:caKey; command: a program of yours signs (an HSM, Vault, step-ca).")
    ca_pem: str | None = setting("ca", _ca, default=None,
                                 doc="The CA certificate, for caKey and command: a path on this machine or its PEM "
                                     "text (pkiDir reads ca.pem from its directory).")
    command: tuple[str, ...] = setting("command", _command, convert=tuple, default=(),
                                       doc="For kind command: the signer program and its arguments, as a list; the "
                                           "program's absolute path first. It reads the CSR on stdin and prints "
                                           "the certificate.")
    timeout_seconds: float = setting("timeoutSeconds", _timeout, convert=float, default=DEFAULT_TIMEOUT_SECONDS,
                                     doc="How long one signing may take, in seconds (at most 3600).")
    max_parallel: int = setting("maxParallel", _max_parallel, convert=int, default=DEFAULT_MAX_PARALLEL,
                                doc="How many certificates are signed at once (1 to 64).")

    @classmethod
    def from_input(cls, value: Mapping[str, Any] | None) -> SignerSpec:
        if not value:
            return cls()
        return cls(kind=str(value.get("kind", KIND_PKI_DIR)), ca_pem=value.get("ca_pem"),
                   command=tuple(value.get("command") or ()),
                   timeout_seconds=float(value.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)),
                   max_parallel=int(value.get("max_parallel", DEFAULT_MAX_PARALLEL)))


def problems(value: object) -> list[tuple[str, str, str]]:
    """What is wrong with a ``signer`` input: (field, problem, fix), field names as in llmgw:signer. Each value is
    checked by its setting's validator; what depends on the kind (which settings it needs or refuses) here."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [("signer", "is not a mapping", "write it as {kind: command, ca: ..., command: [...]}")]
    out = []

    def check(name: str, key: str, validator: Callable[[Any], validate.Problem], default: object) -> None:
        bad = validator(value.get(name, default))
        if bad:
            out.append((f"signer.{key}", *bad))

    kind = value.get("kind", KIND_PKI_DIR)
    check("kind", "kind", _kind, KIND_PKI_DIR)
    if kind in (KIND_CA_KEY, KIND_COMMAND):
        check("ca_pem", "ca", _ca, None)
    if kind == KIND_COMMAND:
        check("command", "command", _command, None)
    elif value.get("command"):
        out.append(("signer.command", f"is given, but the signer is {kind}", "set signer.kind: command, or remove it"))
    check("timeout_seconds", "timeoutSeconds", _timeout, DEFAULT_TIMEOUT_SECONDS)
    check("max_parallel", "maxParallel", _max_parallel, DEFAULT_MAX_PARALLEL)
    return out
