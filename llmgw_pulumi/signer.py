"""How a node's certificate is signed (``llmgw:signer``): one small interface, chosen from config.

A signer gets pure data, a ``SigningRequest`` (the node id, the CSR PEM, the
validity wanted, the extensions wanted), and returns PEM text: the
certificate, or a chain that starts with it. The providers only call
``Signer.sign`` and then ``accept``, which checks the answer against the
request, whatever signed it. Three signers:

- ``pkiDir`` (the default): ca.pem and ca-key.pem read from a directory on
  the machine running Pulumi, at issue time (``signing.KeySigner``);
- ``caKey``: the CA key as the stack secret ``llmgw:caKey``, with the CA
  certificate given as a path or a value (``KeySigner`` too: the key reaches
  the provider process as a secret input that its ``check`` takes out, so it
  is never written to disk and never recorded in state);
- ``command``: an external program (``CommandSigner``), given as an argv
  list, that reads the CSR PEM on stdin and prints the certificate PEM on
  stdout. What it should issue is in its environment (``ENV_*`` below), never
  on its command line. Calls run in parallel, at most ``max_parallel`` at once
  on this machine (a lock file per slot, shared by every provider process).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import child_env, slots
from .errors import SignerError
from .operator_files import exposed
from .text import printable

log = logging.getLogger(__name__)

KIND_PKI_DIR, KIND_CA_KEY, KIND_COMMAND = "pkiDir", "caKey", "command"
KINDS = (KIND_PKI_DIR, KIND_CA_KEY, KIND_COMMAND)
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_PARALLEL = 4
CLOCK_SKEW = dt.timedelta(minutes=5)
"""A certificate starts this long before it is asked for (a node's clock may lag), and a signer may round its
validity by this much either way."""
STDERR_SHOWN = 2000
"""At most this many characters of a signer's stderr are quoted in a message."""

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


@dataclass(frozen=True)
class SignerSpec:
    """``llmgw:signer`` as a ClientCertificate's ``signer`` input (never holding a secret)."""

    kind: str = KIND_PKI_DIR
    ca_pem: str | None = None
    """The CA certificate (PEM text) for caKey and command; pkiDir reads ca.pem from its directory."""
    command: tuple[str, ...] = ()
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_parallel: int = DEFAULT_MAX_PARALLEL

    @classmethod
    def from_input(cls, value: Mapping[str, Any] | None) -> SignerSpec:
        if not value:
            return cls()
        return cls(kind=str(value.get("kind", KIND_PKI_DIR)), ca_pem=value.get("ca_pem"),
                   command=tuple(value.get("command") or ()),
                   timeout_seconds=float(value.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)),
                   max_parallel=int(value.get("max_parallel", DEFAULT_MAX_PARALLEL)))


def problems(value: object) -> list[tuple[str, str, str]]:
    """What is wrong with a ``signer`` input: (field, problem, fix), field names as in llmgw:signer."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [("signer", "is not a mapping", "write it as {kind: command, ca: ..., command: [...]}")]
    out = []
    kind = value.get("kind", KIND_PKI_DIR)
    if kind not in KINDS:
        out.append(("signer.kind", f"{printable(str(kind))!r} is not a signer", f"use one of {', '.join(KINDS)}"))
    if kind in (KIND_CA_KEY, KIND_COMMAND):
        ca = value.get("ca_pem")
        if not isinstance(ca, str) or "-----BEGIN CERTIFICATE-----" not in ca:
            out.append(("signer.ca", "is missing or not a PEM certificate",
                        "give the CA certificate (ca.pem) as a path on this machine or as its PEM text"))
    command = value.get("command")
    if kind == KIND_COMMAND:
        if not isinstance(command, (list, tuple)) or not command or not all(isinstance(a, str) and a for a in command):
            out.append(("signer.command", "is not a list of arguments",
                        "give the signer as an argv list, e.g. [/usr/local/bin/llmgw-sign, --profile, node]"))
        elif not os.path.isabs(command[0]):
            out.append(("signer.command", f"{printable(command[0])!r} is not an absolute path",
                        "give the signer program's absolute path, so no $PATH decides which program signs"))
    elif command:
        out.append(("signer.command", f"is given, but the signer is {kind}", "set signer.kind: command, or remove it"))
    timeout = value.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 3600:
        out.append(("signer.timeoutSeconds", "is not a number of seconds between 0 and 3600", "e.g. 60"))
    bound = value.get("max_parallel", DEFAULT_MAX_PARALLEL)
    if not isinstance(bound, (int, float)) or isinstance(bound, bool) or int(bound) != bound or not 1 <= bound <= 64:
        out.append(("signer.maxParallel", "is not a whole number from 1 to 64", "e.g. 4"))
    return out


# --------------------------------------------------------------------------- signers


FIX_PATH = "set llmgw:signer.command to the signer program's absolute path, executable by this user"


@dataclass(frozen=True)
class CommandSigner:
    """An external program: CSR on stdin, certificate on stdout, the request in its environment."""

    argv: tuple[str, ...]
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_parallel: int = DEFAULT_MAX_PARALLEL

    def ready(self, node: str) -> None:
        """The program is there and may be run: checked before the node is reached."""
        program = self.argv[0]
        if not os.path.isfile(program):
            raise SignerError(node, f"the signer {program} does not exist on this machine", FIX_PATH)
        if not os.access(program, os.X_OK):
            raise SignerError(node, f"the signer {program} is not executable by this user", FIX_PATH)
        found = exposed(program, secret=False)
        if found is not None:
            raise SignerError(node, f"the signer program: {found[0]}", found[1])

    def sign(self, req: SigningRequest) -> str:
        node, program = req.node_id, self.argv[0]
        self.ready(node)
        env = child_env.for_child(req.environment(dt.datetime.now(dt.UTC)))
        with slot(self.argv, self.max_parallel, node=node):
            try:
                done = subprocess.run(list(self.argv), input=req.csr_pem, capture_output=True, text=True, env=env,
                                      timeout=self.timeout_seconds, check=False, close_fds=True)
            except subprocess.TimeoutExpired:
                raise SignerError(node, f"the signer {program} gave no answer within {self.timeout_seconds:g} s",
                                  "check that the signer (its token, its service) answers when run by hand, or "
                                  "raise llmgw:signer.timeoutSeconds") from None
            except OSError as exc:
                raise SignerError(node, f"the signer {program} could not be run ({exc.strerror})", FIX_PATH) from None
        said = _quoted(done.stderr)
        if done.returncode != 0:
            raise SignerError(node, f"the signer {program} failed (exit status {done.returncode})"
                              + (f"; it said:\n{said}" if said else ", saying nothing on stderr"),
                              "run the signer by hand with the request's environment (docs/operations.md, "
                              "'Signers') and fix what it says (a token's PIN, a service's credentials)")
        if "-----BEGIN CERTIFICATE-----" not in done.stdout:
            raise SignerError(node, f"the signer {program} exited 0 but printed no PEM certificate"
                              + (f"; it said:\n{said}" if said else ""),
                              "make the signer print the certificate PEM (or the chain, the node's first) on stdout")
        if said:
            log.warning("%s: the signer %s said on stderr:\n%s", node, program, said)
        return done.stdout


def _quoted(stderr: str) -> str:
    text = printable(stderr.strip(), keep="\n")
    return text if len(text) <= STDERR_SHOWN else text[:STDERR_SHOWN] + " [...]"


def slot_dir(node: str = "") -> Path:
    """Where this user's signer slots are: ``$XDG_RUNTIME_DIR/llmgw-signer`` where it is set (a directory only
    this user may create in), else ``llmgw-pulumi/signer`` in this user's cache directory (``$XDG_CACHE_HOME``,
    or ``~/.cache``); never a predictable name in a directory every user may write (/tmp), where another user
    could create it first. Made 0700; one that exists must be this user's directory, not a link, private to it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        base = Path(runtime) / "llmgw-signer"
    else:
        cache = os.environ.get("XDG_CACHE_HOME")
        base = Path(cache if cache and os.path.isabs(cache) else os.path.join(os.path.expanduser("~"), ".cache"))
        base = base / "llmgw-pulumi" / "signer"
    try:
        base.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        base.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(base)
    except OSError as exc:
        raise SignerError(node, f"cannot make the signer's slot directory {base} ({exc.strerror})",
                          "check that this user may write its cache directory ($XDG_CACHE_HOME or ~/.cache)") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SignerError(node, f"the signer's slot directory {base} is not a directory private to this user "
                          f"(a link, another user's, or open to others)",
                          f"remove {base} (it is remade, 0700), and find out who made it")
    return base


@contextlib.contextmanager
def slot(argv: Sequence[str], bound: int, poll: float = 0.05, node: str = "") -> Iterator[None]:
    """Hold one of ``bound`` slots for this signer, across every process of this user on this machine
    (flock on lock files in a private directory: ``slot_dir``)."""
    key = hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]
    base = slot_dir(node)
    with slots.one_of([base / f"{key}.{i}" for i in range(bound)], lambda: time.sleep(poll)):
        yield
