"""What a pull request's CI job may read of a stack: its config file, without anything the passphrase unlocks.

    python -m llmgw_pulumi.preview.ci review-config STACK OUT

The job that previews a pull request holds no fleet credential (docs/operations.md, "In CI"): not the stack's
passphrase, so not the ``encryptionsalt`` it checks either. This writes the stack's config file to OUT without
that line, for ``pulumi preview --config-file OUT``; the state is then read with a secrets manager that can
decrypt nothing. A config that holds a secret (a ``secure:`` value) is refused, naming each key: its preview
would need the passphrase, and a secret a pull request's job could read is a secret anyone who can push a
branch can read. Such credentials belong in the ``up`` job's protected environment (an SSH agent, a PKI dir or
a signer on the runner), not in the stack's config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

PROGRAM = "python -m llmgw_pulumi.preview.ci"
REVIEW_PASSPHRASE = "a pull request's preview holds no passphrase"
"""What examples/ci/preview.sh gives as PULUMI_CONFIG_PASSPHRASE where it has none: not a secret, and not the
stack's passphrase, so the state's secrets manager opens locked (it can decrypt nothing)."""


class ReviewConfigError(Exception):
    """The stack's config cannot be previewed without credentials; the message says which keys and what to do."""


def stack_config_file(project_dir: Path, stack: str) -> Path:
    """The config file of ``stack`` in the project at ``project_dir`` (Pulumi.yaml's ``stackConfigDir``)."""
    project = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    config_dir = (project.get("stackConfigDir") if isinstance(project, dict) else None) or "."
    name = stack.rsplit("/", 1)[-1]
    return project_dir / str(config_dir) / f"Pulumi.{name}.yaml"


def secret_keys(config: Any) -> list[str]:
    """The config keys whose value holds a ``secure:`` value anywhere inside it."""
    def holds_secret(value: Any) -> bool:
        if isinstance(value, dict):
            return set(value) == {"secure"} or any(holds_secret(v) for v in value.values())
        if isinstance(value, list):
            return any(holds_secret(v) for v in value)
        return False

    if not isinstance(config, dict):
        return []
    return sorted(str(key) for key, value in config.items() if holds_secret(value))


def review_config(text: str, where: str) -> str:
    """The stack config file's text as a pull request's preview reads it: without ``encryptionsalt``; a
    ``ReviewConfigError`` if it holds a secret or another secrets provider's key."""
    document = yaml.safe_load(text) or {}
    if not isinstance(document, dict):
        raise ReviewConfigError(f"{where}: is not a mapping of settings")
    secrets = secret_keys(document.get("config"))
    if secrets:
        raise ReviewConfigError(
            f"{where}: {', '.join(secrets)} {'holds a secret' if len(secrets) == 1 else 'hold secrets'}, which a "
            "pull request's preview cannot read (it holds no passphrase, by design). Keep credentials out of the "
            "stack's config: the up job's protected environment provides them (an ssh-agent for the SSH key, "
            "llmgw:pkiDir or llmgw:signer on the runner for the CA); docs/operations.md, \"In CI\"")
    for key in ("encryptedkey", "secretsprovider"):
        if document.get(key):
            raise ReviewConfigError(f"{where}: `{key}` names a secrets provider other than the passphrase; "
                                    "examples/ci/preview.sh supports passphrase stacks only")
    document.pop("encryptionsalt", None)
    return yaml.safe_dump(document, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0] if __doc__ else None)
    verbs = parser.add_subparsers(dest="verb", required=True)
    config = verbs.add_parser("review-config", help="write STACK's config file to OUT as a pull request's preview reads it")
    config.add_argument("stack")
    config.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    source = stack_config_file(Path.cwd(), args.stack)
    try:
        text = source.read_text()
    except OSError as exc:
        print(f"{PROGRAM}: cannot read the config of stack {args.stack} at {source}: {exc.strerror}; run it in "
              "the Pulumi project's directory", file=sys.stderr)
        return 2
    try:
        args.out.write_text(review_config(text, str(source)))
    except ReviewConfigError as exc:
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
