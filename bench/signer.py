"""The CA-custody issue's benchmark: seconds per certificate through the HSM signer beside the pkiDir default.

    .venv/bin/python -m bench.signer [--nodes 30] [--parallel 4]

Measurement only. In one run, on this machine: a SoftHSM2 token made by
lab.hsm, and a PKI dir made by lab.pki. For each of ``--nodes`` node key pairs
(made beforehand, as the nodes would), the signing step `pulumi up` runs per
certificate: the signer (examples/signers/openssl-pkcs11.sh through openssl's
pkcs11 engine, or the key read from the PKI dir) and the check of what it
returned (pki.accept_signed). Done one after another, then ``--parallel`` at
once (the signer's maxParallel; SoftHSM2 itself fails with concurrent processes: it is for a real HSM). Prints
seconds per certificate and in total.

bench.onboard --signer-sizes times the same step (``per_certificate``) beside the
`pulumi up` of each signer on real lab hosts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lab import pki as labpki
from lab.hsm import SIGNER, Token
from llmgw_pulumi.certificates import pki, signer, signing


def requests(n: int, ca_end: dt.datetime) -> list[signer.SigningRequest]:
    now = dt.datetime.now(dt.UTC)
    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP256R1())
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpu-{i:02d}")]))
               .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode())
        out.append(signer.request(f"gpu-{i:02d}", csr, dt.timedelta(days=365), now, ca_end))
    return out


def timed(sign: Callable[[signer.SigningRequest], str], ca: x509.Certificate, reqs: list[signer.SigningRequest],
          parallel: int) -> float:
    def one(req: signer.SigningRequest) -> None:
        pki.accept_signed(ca, sign(req), req, dt.datetime.now(dt.UTC))

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, reqs))
    return time.perf_counter() - start


HSM, PKI_DIR = "hsm (openssl-pkcs11.sh)", "pkiDir"


def per_certificate(token: Token, pki_dir: Path, nodes: int, parallel: int = 1) -> dict[str, float]:
    """Seconds per certificate of the signing step alone, through ``token`` (HSM) and from ``pki_dir``.

    ``token.signer_env()`` must be in this process's environment (the signer command reads it).
    """
    now = dt.datetime.now(dt.UTC)
    hsm_ca = pki.ca_certificate(token.ca_pem.read_text(), "bench", now)
    hsm = signer.CommandSigner((str(SIGNER),), max_parallel=parallel)

    def pki_dir_sign(req: signer.SigningRequest) -> str:
        # As the provider does per certificate: the PKI dir is read at issue time.
        return signing.KeySigner(pki.load_authority(str(pki_dir), req.node_id, dt.datetime.now(dt.UTC))).sign(req)

    local_ca = pki.load_authority(str(pki_dir), "bench", now).cert
    out = {}
    for name, sign, ca in ((HSM, hsm.sign, hsm_ca), (PKI_DIR, pki_dir_sign, local_ca)):
        reqs = requests(nodes, ca.not_valid_after_utc)
        out[name] = timed(sign, ca, reqs, parallel) / nodes
    return out


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--nodes", type=int, default=30)
    args.add_argument("--parallel", type=int, default=1,
                      help="signer calls at once; SoftHSM2's file store fails concurrent processes (General Error)")
    opts = args.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-signer-"))
    token = Token.create(work / "hsm")
    os.environ.update(token.signer_env())
    labpki.init_ca(work / "pki")
    print(f"{opts.nodes} certificates; seconds per certificate (total)")
    for parallel in sorted({1, opts.parallel}):
        for name, seconds in per_certificate(token, work / "pki", opts.nodes, parallel).items():
            print(f"  {name:24} parallel {parallel}: {seconds:.4f} s ({seconds * opts.nodes:.2f} s)")

if __name__ == "__main__":
    main()
