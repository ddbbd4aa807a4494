"""Which signer signs a node's certificate, chosen from its config (``llmgw:signer``, ``llmgw:pkiDir``).

``signer`` holds the interface (the request, the spec, the external ``CommandSigner``); ``pki`` issues
certificates. This module joins them, so that both stay free of each other: ``KeySigner`` is the CA key in
this process (pkiDir, caKey), ``chosen`` builds the signer a ClientCertificate's config names.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..errors import SignerError
from . import pki, signer


@dataclass(frozen=True)
class KeySigner:
    """pkiDir and caKey: the CA key is in this process (``pki.Authority``)."""

    authority: Any = field(repr=False)

    def sign(self, req: signer.SigningRequest) -> str:
        return pki.issue_for_request(self.authority, req)


def chosen(spec: signer.SignerSpec, node_id: str, pki_dir: str | None, ca_key_pem: str | None,
           now: dt.datetime, passphrase: str | None = None) -> tuple[signer.Signer, Any]:
    """The signer config names, and the CA certificate (``cryptography`` x509) its certificates must chain to."""
    if spec.kind == signer.KIND_COMMAND:
        assert spec.ca_pem is not None
        command = signer.CommandSigner(spec.command, spec.timeout_seconds, spec.max_parallel)
        command.ready(node_id)
        return command, pki.ca_certificate(spec.ca_pem, node_id, now)
    if spec.kind == signer.KIND_CA_KEY:
        assert spec.ca_pem is not None
        if not ca_key_pem:
            raise SignerError(node_id, "llmgw:signer.kind is caKey, but this provider process was given no CA key",
                              "set it: `pulumi config set --secret llmgw:caKey < ca-key.pem`")
        authority = pki.authority_from_pem(spec.ca_pem, ca_key_pem, node_id, now)
        return KeySigner(authority), authority.cert
    if pki_dir is None:
        raise SignerError(node_id, "no signer: llmgw:pkiDir is not set", "set llmgw:pkiDir, or llmgw:signer")
    authority = pki.load_authority(pki_dir, node_id, now, passphrase)
    return KeySigner(authority), authority.cert

