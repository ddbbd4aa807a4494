"""A fleet change summary for a pull request: what each node goes through, from `pulumi preview --json`.

    pulumi preview --json --diff [--refresh] | python -m llmgw_pulumi.preview.cli > summary.md

or, from files, with the preview's exit status and what it wrote to standard
error, and the policy pack's run:

    python -m llmgw_pulumi.preview.cli preview.json --preview-status "$status" \\
        --preview-log preview.log --policy policy.txt > summary.md

The preview of a fleet is four resources per node with their property diffs;
this turns it into one screen of Markdown: how many nodes are onboarded,
upgraded (from which version to which), reconfigured (with the agent.yaml lines
that change), get a new certificate and why, have files repaired, are removed
or untouched; which agents will restart, in the order the rollout
(``llmgw:rollout``) lets them, and which restart outside it; the standing
problems (engines, hardware, nodes that could not be read); and the node ids
of each group, long lists folded.

A preview that failed (its status not 0, its JSON missing, empty or not JSON,
or holding an error) is said to have FAILED in the summary's first line, with
its errors (from the JSON's diagnostics and the log's ``error:`` lines), and
the command exits non-zero: 1, or 2 when the JSON could not be read.

It reads the preview's JSON only (each step's old and new inputs and outputs,
the diagnostics) and reaches no node. Whatever came from a node, a server, the
preview or the config (a hostname in agent.yaml, a problem, a warning, a node
id, a version) is written as text that no Markdown or HTML in it can turn into
anything else (``text.inert``).

This module is the command line. Reading the preview, and the names read from
it, are in llmgw_pulumi.preview.changes; writing the Markdown, and the policy
pack's verdict, in llmgw_pulumi.preview.markdown. The names programs and the
policy pack use are importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import trust_roots
from .changes import (
    AGENT,
    CERTIFICATE,
    CONNECTION,
    ENGINES,
    IDENTITY,
    KEY_ORIGIN,
    NODE_TYPE,
    ROLLOUT,
    UNKNOWN,
    VERSION,
    FleetReview,
    NodeReview,
    changed_inputs,
    kind_of,
    natural,
    preview_errors,
    review,
    touches_node,
)
from .markdown import _ranges as _ranges
from .markdown import failed_markdown, fold_ids, markdown, policy_verdict

__all__ = [
    "AGENT", "CERTIFICATE", "CONNECTION", "ENGINES", "IDENTITY", "KEY_ORIGIN", "NODE_TYPE", "ROLLOUT", "UNKNOWN", "VERSION",
    "FleetReview", "NodeReview", "changed_inputs", "kind_of", "natural", "preview_errors", "review", "touches_node",
    "failed_markdown", "fold_ids", "markdown", "policy_verdict", "main",
]


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw_pulumi.preview.cli", description=__doc__.splitlines()[0])
    parser.add_argument("preview", nargs="?", help="the JSON of `pulumi preview --json` (default: standard input)")
    parser.add_argument("--policy", metavar="FILE",
                        help="the output of `pulumi preview --policy-pack ...`: its verdict is appended")
    parser.add_argument("--preview-status", metavar="N", type=int, default=0,
                        help="the exit status of `pulumi preview --json`: not 0, the summary says the preview failed")
    parser.add_argument("--preview-log", metavar="FILE",
                        help="what `pulumi preview --json` wrote to standard error: a failed preview's `error:` lines")
    parser.add_argument("--ca-read-here", action="store_true",
                        help="on the machine that ran the preview: judge each certificate's pkiDir CA by its ca.pem "
                             "as read here (one that cannot be read is shown as not known, never as unchanged)")
    args = parser.parse_args(argv)
    preview, unreadable = _read_preview(args.preview, stdin)
    failed = bool(args.preview_status or unreadable or preview_errors(preview))  # an error in the JSON fails it too
    if failed:
        log = (_read_text(args.preview_log) or "") if args.preview_log else ""
        errors = preview_errors(preview, log)
        stdout.write(failed_markdown(review(preview).stack, args.preview_status, unreadable, errors) + "\n")
    else:
        fleet = review(preview)
        if args.ca_read_here:
            ca_read_here(fleet, preview, lambda pki_dir: _read_text(str(Path(pki_dir) / "ca.pem")))
        stdout.write(markdown(fleet) + "\n")
    if args.policy:
        cli_output = _read_text(args.policy)
        stdout.write((policy_verdict(cli_output) if cli_output is not None
                      else "**Policies:** the policy preview's output could not be read (see the job's log).") + "\n")
    if unreadable:
        print(f"llmgw_pulumi.preview.cli: {unreadable}; run `pulumi preview --json | python -m llmgw_pulumi.preview.cli`",
              file=sys.stderr)
        return 2
    return 1 if failed else 0


def ca_read_here(fleet: FleetReview, preview: Mapping[str, Any], read: Callable[[str], str | None]) -> None:
    """Each certificate's change of its pkiDir CA as this machine reads ca.pem now (``read``: pkiDir -> the text
    of its ca.pem, None where it cannot be read; trust_roots.ca_as_read), in place of the one its new inputs
    say: where the preview could not read ca.pem, check() kept the recorded fingerprint, and the CA would read
    as unchanged. As the policy pack judges it."""
    for step in preview.get("steps") or []:
        urn, old, new = step.get("urn"), step.get("oldState"), step.get("newState")
        if not (isinstance(urn, str) and kind_of(urn) == CERTIFICATE and step.get("op") not in ("refresh", "read")
                and isinstance(old, Mapping) and isinstance(new, Mapping) and isinstance(new.get("inputs"), Mapping)):
            continue
        node = fleet.nodes.get(urn.split("::")[-1])
        if node is None:
            continue
        inputs = new["inputs"]
        pki_dir = inputs.get("pki_dir")
        pem = read(pki_dir) if isinstance(pki_dir, str) else None
        as_read = trust_roots.ca_as_read(inputs, trust_roots.pem_sha256(pem) if pem is not None else None)
        ca = [c for c in trust_roots.changes(CERTIFICATE, old.get("inputs") or {}, as_read) if c.setting == "ca"]
        node.trust_roots = tuple(sorted({*(c for c in node.trust_roots if c.setting != "ca"), *ca}))


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _read_preview(path: str | None, stdin: TextIO) -> tuple[dict[str, Any], str | None]:
    """(the preview's JSON, or {}; why it could not be read, or None)."""
    text = _read_text(path) if path else stdin.read()
    if text is None:
        return {}, "the preview's JSON could not be read"
    if not text.strip():
        return {}, "the preview wrote no JSON"
    try:
        preview = json.loads(text)
    except json.JSONDecodeError as e:
        return {}, f"the preview's output is not JSON ({e})"
    if not isinstance(preview, dict):
        return {}, "the preview's output is not the JSON of `pulumi preview --json`"
    return preview, None


if __name__ == "__main__":
    sys.exit(main())
