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
  stdout. What it should issue is in its environment (``ENV_*``), never
  on its command line. Calls run in parallel, at most ``max_parallel`` at once
  on this machine (a lock file per slot, shared by every provider process).

The interface itself (the request, the spec, the kinds, the ``ENV_*`` names, the checks of ``llmgw:signer``)
is pure data, in ``llmgw_pulumi.config.signer``; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import child_env, slots
from ..config.signer import CLOCK_SKEW as CLOCK_SKEW
from ..config.signer import DEFAULT_MAX_PARALLEL as DEFAULT_MAX_PARALLEL
from ..config.signer import DEFAULT_TIMEOUT_SECONDS as DEFAULT_TIMEOUT_SECONDS
from ..config.signer import ENV_EXTENDED_KEY_USAGE as ENV_EXTENDED_KEY_USAGE
from ..config.signer import ENV_EXTENSIONS as ENV_EXTENSIONS
from ..config.signer import ENV_KEY_USAGE as ENV_KEY_USAGE
from ..config.signer import ENV_NODE_ID as ENV_NODE_ID
from ..config.signer import ENV_NOT_AFTER as ENV_NOT_AFTER
from ..config.signer import ENV_NOT_AFTER_ASN1 as ENV_NOT_AFTER_ASN1
from ..config.signer import ENV_NOT_BEFORE as ENV_NOT_BEFORE
from ..config.signer import ENV_NOT_BEFORE_ASN1 as ENV_NOT_BEFORE_ASN1
from ..config.signer import ENV_SERIAL as ENV_SERIAL
from ..config.signer import ENV_SUBJECT as ENV_SUBJECT
from ..config.signer import ENV_VALIDITY_SECONDS as ENV_VALIDITY_SECONDS
from ..config.signer import EXTENDED_KEY_USAGE as EXTENDED_KEY_USAGE
from ..config.signer import EXTENSIONS as EXTENSIONS
from ..config.signer import KEY_USAGE as KEY_USAGE
from ..config.signer import KIND_CA_KEY as KIND_CA_KEY
from ..config.signer import KIND_COMMAND as KIND_COMMAND
from ..config.signer import KIND_PKI_DIR as KIND_PKI_DIR
from ..config.signer import KINDS as KINDS
from ..config.signer import Signer as Signer
from ..config.signer import SignerSpec as SignerSpec
from ..config.signer import SigningRequest as SigningRequest
from ..config.signer import problems as problems
from ..config.signer import request as request
from ..errors import SignerError
from ..operator_files import exposed
from ..text import printable

log = logging.getLogger(__name__)

STDERR_SHOWN = 2000
"""At most this many characters of a signer's stderr are quoted in a message."""


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
