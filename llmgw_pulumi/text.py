"""Text that came from a node, made safe to show to the operator (pure).

A node is not trusted to print only what it should: a hostname, a GPU name,
an engine's error or a script's stderr can hold escape sequences that move
the cursor, recolour or rewrite what the operator's terminal already shows,
bidirectional overrides that reorder it, or a newline that forges a line of
our own (``  fix: ...``). ``printable`` is applied where node text enters the
operator's side: the parsers of what scripts print (``facts``), the stderr
of a failed script (``providers.base.raise_for``), and, as a last net, every
error message (``errors.LlmgwError``) and log record (``providers._diagnostics``).

In Markdown (the pull-request summary, llmgw_pulumi.preview.markdown) such text
must also stay text: ``inert`` shows it as a code span, in which neither
CommonMark nor GitHub makes a link, an image, HTML, emphasis, a block, a
mention or an issue reference of anything.
"""

from __future__ import annotations

import re
import shlex

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    """How Python writes ``char`` in a string literal: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable shown as its escape (``\\x1b``, ``\\u202e``).

    Not printable is what ``str.isprintable`` says: control characters, format
    characters (bidirectional overrides, zero-width ones), line and paragraph
    separators, every space but the ASCII one, surrogates and unassigned code
    points. ``keep``: characters kept as they are (``"\\n"`` for a multi-line
    message whose lines are all ours). Text that is all printable is returned
    unchanged, and the result is always printable but for ``keep``, so applying
    it again changes nothing.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


INERT_LIMIT = 300
"""The most characters of one value ``inert`` shows; the rest are counted."""


def inert(text: object, limit: int = INERT_LIMIT) -> str:
    """``text`` as a Markdown code span, so that nothing it holds takes effect: shown, never rendered.

    The text is made printable first (one line: a newline is shown as ``\\n``),
    and cut to ``limit`` characters, the rest counted. The span's fence is one
    backtick longer than the longest run of backticks in the text, so the text
    cannot close it; a text that starts or ends with a backtick or a space is
    padded with a space on each side, which CommonMark strips. In a code span
    GitHub links no ``@mention``, ``#123`` or commit hash either. A ``|`` still
    ends a table cell (GFM splits a table's rows before it reads code spans):
    a table row escapes it (``preview.markdown``).
    """
    shown = printable(str(text))
    more = len(shown) - limit
    if more > 0:
        shown = shown[:limit]
    if not shown.strip(" "):
        shown = shown or " "  # empty, or only spaces: shown as the spaces (CommonMark strips none of them)
    elif shown[0] in "` " or shown[-1] in "` ":
        shown = f" {shown} "
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", shown)), default=0))
    return f"{fence}{shown}{fence}" + (f"… ({more} more characters)" if more > 0 else "")


def ssh_command(target: str, *argv: str) -> str:
    """``ssh TARGET ARGV...`` as an operator can paste it (in a fix or a hint).

    ssh joins the words it is given with spaces, and the node's shell reads the
    result: each of ``argv`` is quoted for the node's shell, and that quoted word
    again for the operator's. A plain path stays as it is; one with a space
    reads ``"'/opt/my dir/x'"``; a hostile one stays one argument on the node.
    """
    return " ".join(["ssh", shlex.quote(target), *(_for_both_shells(word) for word in argv)])


def _for_both_shells(word: str) -> str:
    on_node = shlex.quote(word)
    if on_node == word:
        return word
    if not set(on_node) & set('$`\\"!'):  # nothing the operator's shell expands inside double quotes
        return f'"{on_node}"'
    return shlex.quote(on_node)
