"""The pull-request summary shows what nodes, servers, the preview and the policy pack wrote as text (issue 36, N3).

A hostile corpus (tests/fixtures/review/hostile.json: links, images, autolinks, raw HTML, ``</details>``,
comments, emphasis, headings, table breaks, mentions, issue references, backtick and fence break-outs, a forged
verdict, terminal escapes, a very long line) is put in every place of a preview, and of the policy pack's
output, where such text can reach the summary, and the summary is parsed by a CommonMark parser (markdown-it-py,
with GFM tables). Each payload, given to the parser as it is, makes what the corpus says it makes (the positive
control); in the summary it makes nothing: the summary's token stream is the one a harmless text of the same
shape gives, and the payload's marker (``pwn``) is only ever inside a code span.
"""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from llmgw_pulumi import decisions
from llmgw_pulumi.preview import cli
from tests.unit.inert_markdown import MARKER, PARSER, assert_marker_only_in_code, kinds, leaves
from tests.unit.review_previews import NOW, created, preview

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "review"


def corpus() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((FIXTURES / "hostile.json").read_text())
    return [{**e, "payload": e["payload"] + "A" * e.get("pad", 0)} for e in entries]


CORPUS = corpus()


@pytest.mark.parametrize("entry", CORPUS, ids=[e["name"] for e in CORPUS])
def test_each_payload_given_to_the_parser_as_it_is_makes_what_the_corpus_says(entry):
    # The positive control of the checks below: each payload is live Markdown.
    assert entry["rendered_raw"] in kinds(entry["payload"]), kinds(entry["payload"])
    assert MARKER in entry["payload"]


def harmless(text: str) -> str:
    """A text of the same shape as ``text`` (its lines, their lengths, which of them are agent.yaml comments) that
    holds no Markdown but where ``#`` starts a line."""
    return re.sub(r"[^\s#]", "x", text)


def renamed(data: dict[str, Any], old: str, new: str) -> None:
    """The node ``old`` named ``new`` in every step and diagnostic."""
    for item in (*data["steps"], *data["diagnostics"]):
        if item.get("urn", "").endswith(f"::{old}"):
            item["urn"] = item["urn"].removesuffix(old) + new


def hostile_preview(text: str) -> dict[str, Any]:
    """The fixture's preview with ``text`` wherever a node, the config or a server can put text: the stack's name,
    node ids, versions (upgraded, and onboarded), fabrics, agent.yaml, the paths a refresh found drifted, an
    engine's problem, a warning, a node that could not be read. node14 (problem, warning, unreadable, untouched,
    among the first ids of a folded list) and node12 (repaired, re-issued, restarting outside the rollout) are
    named by the text."""
    data = preview()
    steps = data["steps"]
    for stack in (s for s in steps if s["urn"].endswith("pulumi:pulumi:Stack::llmgw-test")):
        stack["urn"] = stack["urn"].replace("urn:pulumi:test::", f"urn:pulumi:{text}::")
    engines = next(s for s in steps if s["urn"].endswith("EngineCheck::node14"))
    engines["newState"]["outputs"]["problems"] = [{"problem": text, "hint": text}]
    agent = next(s for s in steps if s["urn"].endswith("AgentInstall::node11") and s["op"] == "update")
    agent["newState"]["inputs"]["agent_yaml"] += f"hostname: {text}\n"
    upgraded = next(s for s in steps if s["urn"].endswith("AgentInstall::node10") and s["op"] == "update")
    upgraded["oldState"]["inputs"]["version"] = text
    upgraded["newState"]["inputs"]["version"] = text + "-2"
    identity = next(s for s in steps if s["urn"].endswith("NodeIdentity::node12") and s["op"] == "update")
    identity["oldState"]["inputs"]["drift"] = {text: "absent"}
    data["diagnostics"] += [
        {"urn": engines["urn"], "severity": "warning", "message": f"warning: {text}\n"},
        {"urn": engines["urn"].replace("EngineCheck", "NodeIdentity"), "severity": "warning",
         "message": f"warning: {decisions.unreadable_warning(f'node14: cannot reach {text} over ssh')}\n"},
    ]
    for i in range(1, 10):  # untouched nodes after node14 in natural order, no runs: the untouched list is folded
        steps.append({"op": "refresh", "urn": engines["urn"].replace("::node14", f"::~filler-{2 * i:02d}"),
                      "newState": {"inputs": {}, "outputs": {}}})
    steps += created(data, "node15", agent={"version": text, "fabrics": [{"name": text, "hcas": ["mlx5_0"]}]})
    renamed(data, "node14", text)
    renamed(data, "node12", text + "-2")
    return data


def hostile_policy_run(text: str) -> str:
    """The CLI's ``Policies:`` block as `pulumi preview --policy-pack` prints it, with ``text`` as the name of the
    resources the rules name, in what they report (each line of a message indented by ten spaces), and, without
    its spaces, as the name of a rule."""
    name = text.replace("\n", " ")
    lines = ["Policies:", "    \u274c llmgw-fleet@v0.1.0 (local: /venv/llmgw_pulumi/policy)"]
    for level, rule in (("mandatory", "release-verified"), ("advisory", "".join(text.split()))):
        for resource in (name, f"{name}-2"):
            lines += [f"        - [{level}]  {rule}  (pulumi-python:dynamic/llmgw:AgentInstall: {resource})",
                      "          The rule's description.",
                      *(f"          {line}" for line in f"{resource}: {text}".split("\n"))]
    return "\n".join([*lines, "", "Resources:", "    4 unchanged", ""])


def summary_of(data: dict[str, Any], policy: str, tmp_path: Path) -> str:
    (tmp_path / "preview.json").write_text(json.dumps(data))
    (tmp_path / "policy.txt").write_text(policy)
    out = io.StringIO()
    assert cli.main([str(tmp_path / "preview.json"), "--policy", str(tmp_path / "policy.txt")], stdout=out) == 0
    return out.getvalue()


def assert_inert(summary: str, twin: str) -> None:
    """``summary`` holds hostile text only as text: it parses to the tokens of ``twin`` (the same summary of a
    harmless text of the same shape), and the marker is only in code spans."""
    tokens, twin_tokens = list(leaves(PARSER.parse(summary))), list(leaves(PARSER.parse(twin)))
    assert [t.type for t in tokens] == [t.type for t in twin_tokens], summary
    assert_marker_only_in_code(summary)


@pytest.mark.parametrize("entry", CORPUS, ids=[e["name"] for e in CORPUS])
def test_what_a_node_or_the_config_wrote_is_inert_in_every_place_of_the_summary(entry, tmp_path):
    text = entry["payload"]
    data = hostile_preview(text)
    fleet = cli.review(copy.deepcopy(data), NOW)
    assert {text, text + "-2"} <= set(fleet.nodes) and fleet.nodes[text].problems and fleet.nodes[text].unreadable
    summary = summary_of(data, hostile_policy_run(text), tmp_path)
    print(summary)
    twin = harmless(text)
    assert_inert(summary, summary_of(hostile_preview(twin), hostile_policy_run(twin), tmp_path))
    verdict = summary[summary.index("\n**Policies:") + 1:]
    assert verdict.startswith("**Policies: a mandatory rule is violated** (4 violations)"), verdict
    assert len([line for line in verdict.splitlines() if line.startswith("- ")]) == 2, verdict
    lines = summary.splitlines()
    assert lines[0].startswith("### Fleet change — ") and lines[0].endswith(": 15 nodes"), lines[0]
    for line in lines:  # the table keeps its three columns: the count of each row is a number
        if line.startswith("| ") and not line.startswith(("| what", "|---")):
            cells = PARSER.parse("| a | b | c |\n|---|---|---|\n" + line)
            counts = [t.content for t in leaves(cells) if t.type == "inline"][3:]
            assert len(counts) == 3 and counts[1].isdigit(), (line, counts)


def failed_summary_of(text: str, tmp_path: Path) -> str:
    """The summary of a failed preview of ``hostile_preview(text)``: its JSON holds an error about the node named
    by the text and one about the stack, and its log ``error:`` lines of the text."""
    data = hostile_preview(text)
    urn = next(s["urn"] for s in data["steps"] if s["urn"].endswith(f"NodeIdentity::{text}"))
    data["diagnostics"] += [{"urn": urn, "severity": "error", "message": f"error: {text}\n"},
                            {"urn": data["steps"][0]["urn"], "severity": "error", "message": f"error: {text}-2\n"}]
    (tmp_path / "preview.json").write_text(json.dumps(data))
    (tmp_path / "preview.log").write_text("".join(f"error: {line} (log {i})\n" for i, line in enumerate(text.split("\n"))))
    out = io.StringIO()
    status = cli.main([str(tmp_path / "preview.json"), "--preview-status", "1",
                          "--preview-log", str(tmp_path / "preview.log")], stdout=out)
    assert status == 1
    return out.getvalue()


@pytest.mark.parametrize("entry", CORPUS, ids=[e["name"] for e in CORPUS])
def test_the_errors_of_a_failed_preview_are_inert(entry, tmp_path):
    text = entry["payload"]
    summary = failed_summary_of(text, tmp_path)
    print(summary)
    assert "the preview FAILED (exit status 1)" in summary.splitlines()[0]
    errors = [line for line in summary.splitlines() if line.startswith("- ")]
    assert len(errors) == 2 + len(text.split("\n")), errors
    assert_inert(summary, failed_summary_of(harmless(text), tmp_path))
