"""A CommonMark parser (markdown-it-py, with GFM tables) and the checks that text from a node, the config or a
server, carrying a marker, is inert in a Markdown summary: only ever shown inside code spans."""

from __future__ import annotations

import re
from collections.abc import Iterator

from markdown_it import MarkdownIt
from markdown_it.token import Token

from llmgw_pulumi.text import INERT_LIMIT

MARKER = "pwn"
"""In every payload, and in nothing the summary says of its own."""
PARSER = MarkdownIt("commonmark").enable("table")
OWN_HTML = re.compile(r"</?details>|<summary>|</summary>")
"""The only HTML the summary writes: the folds of long lists."""


def leaves(tokens: list[Token]) -> Iterator[Token]:
    for t in tokens:
        yield t
        yield from t.children or []


def kinds(markdown: str) -> set[str]:
    """What the parser makes of ``markdown``: its token types, and what GitHub would make of its live text (a
    mention, an issue reference), a forged line of the verdict, control characters, a line too long to read."""
    found = set()
    for t in leaves(PARSER.parse(markdown)):
        found.add(t.type)
        if t.type == "text":
            if re.search(r"@\w", t.content):
                found.add("mention")
            if re.search(r"#\d", t.content):
                found.add("reference")
            if "Policies" in t.content or "no mandatory rule" in t.content:
                found.add("forged")
        if not t.content.isprintable():
            found.add("control")
        if len(t.content) > 1000:
            found.add("long")
    return found


def assert_marker_only_in_code(summary: str) -> None:
    """No link, image, code block or HTML but the summary's folds; no mention or issue reference in its text; the
    marker shown, and only in code spans, none longer than ``text.inert`` makes them."""
    tokens = list(leaves(PARSER.parse(summary)))
    for t in tokens:
        assert t.type not in ("link_open", "image", "fence", "code_block"), (t, summary)
        if t.type in ("html_inline", "html_block"):
            assert not OWN_HTML.sub("", t.content).strip(" \nal0123456789"), (t, summary)  # `all 12` is ours
        if t.type == "text":
            assert not re.search(r"@\w|#\d", t.content), (t, summary)
        if t.type not in ("inline", "code_inline"):  # an inline token's content is its source, code spans and all
            assert MARKER not in t.content.lower() and MARKER not in str(t.attrs).lower(), (t, summary)
        if t.type == "code_inline":
            assert len(t.content) <= INERT_LIMIT + 2, (t, summary)  # and a space on each side
    spans = [t.content for t in tokens if t.type == "code_inline" and MARKER in t.content]
    assert spans, summary  # the text is shown, in code spans
