"""A fleet change summary for a pull request: what each node goes through, from `pulumi preview --json`.

    pulumi preview --json --diff [--refresh] | python -m llmgw_pulumi.review > summary.md

The preview of a fleet is four resources per node with their property diffs;
this turns it into one screen of Markdown: how many nodes are onboarded,
upgraded (from which version to which), reconfigured (with the agent.yaml lines
that change), get a new certificate and why, have files repaired, are removed
or untouched; which agents will restart, in the order the rollout
(``llmgw:rollout``) lets them, and which restart outside it; the standing
problems (engines, hardware, nodes that could not be read); and the node ids
of each group, long lists folded.

It reads the preview's JSON only (each step's old and new inputs and outputs,
the diagnostics) and reaches no node. Whatever came from a node, a server, the
preview or the config (a hostname in agent.yaml, a problem, a warning, a node
id, a version) is written as text that no Markdown or HTML in it can turn into
anything else (``text.inert``).

This module is the command line. Reading the preview, and the names read from
it, are in llmgw_pulumi.fleet_review; writing the Markdown, and the policy
pack's verdict, in llmgw_pulumi.review_markdown. The names programs and the
policy pack use are importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .fleet_review import (
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
    review,
    touches_node,
)
from .review_markdown import _ranges as _ranges
from .review_markdown import fold_ids, markdown, policy_verdict

__all__ = [
    "AGENT", "CERTIFICATE", "CONNECTION", "ENGINES", "IDENTITY", "KEY_ORIGIN", "NODE_TYPE", "ROLLOUT", "UNKNOWN", "VERSION",
    "FleetReview", "NodeReview", "changed_inputs", "kind_of", "natural", "review", "touches_node",
    "fold_ids", "markdown", "policy_verdict", "main",
]


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw_pulumi.review", description=__doc__.splitlines()[0])
    parser.add_argument("preview", nargs="?", help="the JSON of `pulumi preview --json` (default: standard input)")
    parser.add_argument("--policy", metavar="FILE",
                        help="the output of `pulumi preview --policy-pack ...`: its verdict is appended")
    args = parser.parse_args(argv)
    text = Path(args.preview).read_text() if args.preview else stdin.read()
    try:
        preview = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"llmgw_pulumi.review: the input is not the JSON of `pulumi preview --json` ({e}); "
              "run `pulumi preview --json | python -m llmgw_pulumi.review`", file=sys.stderr)
        return 2
    stdout.write(markdown(review(preview)) + "\n")
    if args.policy:
        stdout.write(policy_verdict(Path(args.policy).read_text(errors="replace")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
