"""The environment of every process this package starts: its own, without what Pulumi hands it in confidence.

The language host gives the program the stack's whole config, decrypted, in ``PULUMI_CONFIG`` (secrets
included: ``llmgw:caKey``, ``llmgw:sshKeyPassphrase``), and the CLI's environment holds the passphrase that
decrypts the stack and the backend's token. A signer program, a local agent build asked for its version,
ssh-keygen or a Python interpreter needs none of them, and none of them is theirs to read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CONFIG = ("PULUMI_CONFIG", "PULUMI_CONFIG_SECRET_KEYS", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")
"""The stack's config and what decrypts it: never passed on."""
BACKEND = ("PULUMI_ACCESS_TOKEN",)
"""The state backend's token: passed on only to the `pulumi` CLI this package runs itself."""


def for_child(extra: Mapping[str, str] | None = None, *, backend: bool = False,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment (or ``environ``) without ``CONFIG`` (and ``BACKEND`` unless ``backend``),
    with ``extra`` added."""
    withheld = set(CONFIG) if backend else {*CONFIG, *BACKEND}
    source = os.environ if environ is None else environ
    return {**{k: v for k, v in source.items() if k not in withheld}, **(extra or {})}
