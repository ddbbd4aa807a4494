"""docs/configuration.md is the settings' declarations, rendered: regenerated here and compared, and every key the
stack config accepts is in it with what it means."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from llmgw_pulumi.config import stack_config
from llmgw_pulumi.stack import component_types, reference

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


def rows(text: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """Each section's table as key -> its cells (key without backticks), read by a CommonMark parser."""
    toks = MarkdownIt("commonmark").enable("table").parse(text)
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    section, row, cells = "", None, []
    for i, tok in enumerate(toks):
        if tok.type == "heading_open":
            section = toks[i + 1].content
        elif tok.type == "tr_open":
            cells = []
        elif tok.type == "inline" and toks[i - 1].type in ("td_open",):
            cells.append(tok.content)
        elif tok.type == "tr_close" and cells:
            row = (cells[0].strip("`"), *cells[1:])
            out.setdefault(section, {})[row[0]] = tuple(row)
    return out


def test_the_page_is_what_the_declarations_say() -> None:
    assert PAGE.read_text() == reference.render(), \
        "docs/configuration.md is stale: run `python -m llmgw_pulumi.stack.reference > docs/configuration.md`"


def missing(page: dict[str, dict[str, tuple[str, ...]]]) -> list[str]:
    """Every stack-config key (stack_config.key_paths) without a row that says what it means."""
    node = page.get("A node", {})
    stack = {**page.get("The stack", {}), **page.get("Secrets", {})}
    out = []
    for path in sorted(stack_config.key_paths(stack_config.SCHEMA)):
        table, key = (node, path.removeprefix("nodes.")) if path.startswith("nodes.") else (stack, path)
        found = {k.replace("[]", ""): cells for k, cells in table.items()}.get(key)
        if found is None or not found[3].strip():
            out.append(path)
    return out


def test_every_key_the_stack_config_accepts_is_there_with_its_meaning() -> None:
    page = rows(PAGE.read_text())
    assert len(page["A node"]) > 20 and len(page["Secrets"]) == len(stack_config.SECRET_KEYS)
    assert missing(page) == []


def test_a_key_without_a_meaning_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above reads the page: a setting declared without a doc, or a key no declaration covers, fails it.
    declared = component_types.declared_settings()
    undocumented = tuple(dataclasses.replace(d, doc="") if d.key == "pkiDir" else d for d in declared)
    monkeypatch.setattr(component_types, "declared_settings", lambda: undocumented)
    assert missing(rows(reference.render())) == ["pkiDir"]
    monkeypatch.setattr(stack_config, "SCHEMA", {**stack_config.SCHEMA, "newKey": None})
    assert "newKey" in missing(rows(reference.render()))


def test_defaults_types_and_the_stack_config_s_own_spelling_are_shown() -> None:
    page = rows(reference.render())
    assert page["A node"]["id"][1:3] == ("text", "required")
    assert "nodeId" not in page["A node"]
    assert page["The stack"]["signer.kind"][1:3] == ("text", '`"pkiDir"`')
    assert page["The stack"]["ssh.port"][1:3] == ("whole number", "`22`")
    assert page["The stack"]["nodes"][1] == "list of mappings"
    assert "Also a node's own setting." in page["The stack"]["servers"][3]
    assert "Also a node's own setting." not in page["The stack"]["pkiDir"][3]


def test_a_doc_holding_a_pipe_stays_one_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = component_types.declared_settings()
    piped = tuple(dataclasses.replace(d, doc="node | operator") if d.key == "pkiDir" else d for d in declared)
    monkeypatch.setattr(component_types, "declared_settings", lambda: piped)
    assert rows(reference.render())["The stack"]["pkiDir"][3] == "node | operator"
