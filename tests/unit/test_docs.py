"""The docs name only what exists: every relative link resolves to a file of the repository (and its #anchor to a
heading there), every repository path a doc names in backticks exists, and every `llmgw:<key>` setting a doc names
is one the schema declares (or, in an example's README, one the example's own program reads).

The Markdown is read by a CommonMark parser (markdown-it-py), so a link, a heading and a code span are what a
renderer takes them to be; code blocks are left out of the path and link checks (they show commands)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from llmgw_pulumi.config import stack_config

REPO = Path(__file__).resolve().parents[2]

PARSER = MarkdownIt("commonmark").enable("table")


def documents(root: Path) -> list[Path]:
    """The docs a user reads: README.md, docs/*.md and every example's README."""
    return sorted([root / "README.md", *root.glob("docs/*.md"), *root.glob("examples/**/README.md")])


def tokens(path: Path) -> list[Token]:
    return PARSER.parse(path.read_text())


def walk(toks: list[Token]) -> Iterator[Token]:
    """Every token, inline children after their parent."""
    for tok in toks:
        yield tok
        if tok.children:
            yield from walk(tok.children)


def slug(text: str) -> str:
    """A heading's anchor as GitHub and GitLab make it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file (a repeated one gets -1, -2, ... as GitHub numbers them)."""
    toks = tokens(path)
    seen: dict[str, int] = {}
    found: set[str] = set()
    for i, tok in enumerate(toks):
        if tok.type != "heading_open":
            continue
        inline = toks[i + 1]
        text = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def located(toks: list[Token]) -> Iterator[tuple[int, Token]]:
    """(1-based line, token) for every token; inline children take the line of the block they are in. (A code
    block's text is one token: the parser reads no link or code span in it.)"""
    for tok in toks:
        line = tok.map[0] + 1 if tok.map else 0
        yield line, tok
        for child in tok.children or []:
            yield line, child


def inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def link_problems(root: Path, doc: Path) -> list[str]:
    problems = []
    for line, tok in located(tokens(doc)):
        target = tok.attrGet("href") if tok.type == "link_open" else tok.attrGet("src") if tok.type == "image" else None
        if not isinstance(target, str) or re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # not a link, or an absolute URL (https:, mailto:)
        where = f"{doc.relative_to(root)}:{line}: link {target!r}"
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part) if path_part else doc
        if not inside(root, path):
            problems.append(f"{where} points outside the repository")
        elif not path.exists():
            problems.append(f"{where}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{where}: {path.relative_to(root)} has no heading with that anchor")
    return problems


PATH_SPAN = re.compile(r"(?:\.\./)*[\w.-]+(?:/[\w.-]*)+")
"""A code span that is a path with at least one slash (e.g. `scripts/test`, `docs/x.md`, `../examples/racks`)."""
PLACEHOLDER = re.compile(r"\.[A-Z][A-Z_]+\.")
"""A file name with an upper-case word standing for a value (`stacks/policy.STACK.json`: one file per stack)."""


def repository_roots(root: Path) -> set[str]:
    """The names a repository path starts with: the repository's top-level files and folders (not hidden ones)."""
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}


def path_problems(root: Path, doc: Path) -> list[str]:
    problems = []
    tops = repository_roots(root)
    for line, tok in located(tokens(doc)):
        if tok.type != "code_inline":
            continue
        span = tok.content.split("::")[0]  # tests/unit/test_x.py::test_name names the file
        if not PATH_SPAN.fullmatch(span) or PLACEHOLDER.search(span):
            continue  # not a path, or one with placeholders (<module>, *, {a,b}, $VAR, STACK)
        where = f"{doc.relative_to(root)}:{line}: `{tok.content}`"
        if span.startswith("../"):
            path = doc.parent / span
            if not inside(root, path):
                problems.append(f"{where} points outside the repository")
                continue
        elif span.split("/")[0] in tops or (doc.parent / span).exists():
            path = doc.parent / span if (doc.parent / span).exists() else root / span  # an example's own files
        else:
            continue  # a path on a node or in a project (/etc/llmgw, racks/rack-a.csv), not the repository's
        if not path.exists():
            problems.append(f"{where}: no such file or folder in the repository")
    return problems


SETTING = re.compile(r"(?<![\w/])llmgw:([A-Za-z]\w*(?:\.[A-Za-z]\w*)*)(?![\w:])")
"""`llmgw:<key>` with its dotted sub-keys (llmgw:signer.maxParallel); not a type token (llmgw:index:Node,
pulumi-python:dynamic/llmgw:AgentInstall)."""

CONFIG_READ = re.compile(r"\b(?:config|conf|cfg)\.\w+(?:<\w+>)?\(\s*[\"'](\w+)[\"']")
"""A key an example's own program reads from its `pulumi.Config("llmgw")` (Python, TypeScript, Go)."""


def declared_settings() -> set[str]:
    """Every setting the one schema declares, as dotted paths (ssh.wait, nodes.hostKey, ...)."""
    return stack_config.key_paths()


def own_settings(root: Path, doc: Path) -> set[str]:
    """The keys an example's own program reads: an example's README may name them."""
    if not doc.is_relative_to(root / "examples"):
        return set()
    sources = [p for p in doc.parent.rglob("*") if p.suffix in (".py", ".ts", ".go") and "node_modules" not in p.parts]
    return {key for p in sources for key in CONFIG_READ.findall(p.read_text())}


def setting_problems(root: Path, doc: Path, declared: set[str]) -> list[str]:
    problems = []
    own = own_settings(root, doc)
    for number, text in enumerate(doc.read_text().splitlines(), 1):
        for key in SETTING.findall(text):
            if key not in declared and key.split(".")[0] not in own:
                problems.append(f"{doc.relative_to(root)}:{number}: llmgw:{key} is no setting the schema declares")
    return problems


def all_problems(root: Path, declared: set[str]) -> list[str]:
    return [p for doc in documents(root)
            for p in (*link_problems(root, doc), *path_problems(root, doc), *setting_problems(root, doc, declared))]


def test_every_doc_names_only_what_exists() -> None:
    docs = documents(REPO)
    assert REPO / "README.md" in docs and REPO / "docs" / "operations.md" in docs
    assert any(d.is_relative_to(REPO / "examples") for d in docs)
    assert all_problems(REPO, declared_settings()) == []


def test_the_checks_see_what_the_docs_hold() -> None:
    # So that the test above cannot pass by finding nothing: the docs' links, paths and settings are seen.
    readme, operations = REPO / "README.md", REPO / "docs" / "operations.md"
    hrefs = [t.attrGet("href") for _, t in located(tokens(readme)) if t.type == "link_open"]
    assert "docs/operations.md" in hrefs
    spans = [t.content for _, t in located(tokens(readme)) if t.type == "code_inline"]
    assert any(PATH_SPAN.fullmatch(s) and s.split("/")[0] in repository_roots(REPO) for s in spans)
    assert "fleet-wide-upgrades-llmgwrollout" in anchors(operations)
    assert "rollout.maxParallel" in declared_settings()
    assert "llmgw:rollout" in operations.read_text()


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A repository of its own: a README, one docs page with two headings, and an example whose program reads a
    key of its own."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test").write_text("")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Fleet-wide upgrades (`llmgw:rollout`)\n\n## Notes\n\n## Notes\n")
    (tmp_path / "README.md").write_text("# Fake\n\nSee [the guide](docs/guide.md) and `scripts/test`.\n")
    (tmp_path / "examples" / "vm").mkdir(parents=True)
    (tmp_path / "examples" / "vm" / "__main__.py").write_text('config = pulumi.Config("llmgw")\nconfig.get("vm")\n')
    (tmp_path / "examples" / "vm" / "README.md").write_text("Set `llmgw:vm` and `llmgw:pkiDir`.\n")
    return tmp_path


DECLARED = {"pkiDir", "rollout", "rollout.maxParallel", "signer", "signer.maxParallel"}


def test_a_repository_whose_docs_are_true_shows_no_problem(fake_repo: Path) -> None:
    (fake_repo / "README.md").write_text(
        "# Fake\n\n[guide](docs/guide.md#fleet-wide-upgrades-llmgwrollout), [top](#fake), ![p](docs/guide.md),\n"
        "[notes](docs/guide.md#notes-1), [site](https://example.com/x.md), `scripts/test`,\n"
        "`tests/unit/x.py::test_y`, `/etc/llmgw/ca.pem`,\n"
        "`llmgw:signer.maxParallel`, `llmgw:index:Node`, `pulumi-python:dynamic/llmgw:AgentInstall`.\n\n"
        "```\nsee [gone](docs/gone.md) and `docs/gone.md`  # a code block is text, not links\n```\n")
    (fake_repo / "tests").mkdir()
    (fake_repo / "tests" / "unit").mkdir()
    (fake_repo / "tests" / "unit" / "x.py").write_text("")
    assert all_problems(fake_repo, DECLARED) == []


@pytest.mark.parametrize(("readme", "found"), [
    ("[gone](docs/gone.md)", "README.md:3: link 'docs/gone.md': no such file"),
    ("![plot](docs/gone.png)", "README.md:3: link 'docs/gone.png': no such file"),
    ("[guide](docs/guide.md#no-such-heading)", "docs/guide.md has no heading with that anchor"),
    ("[here](#nowhere)", "link '#nowhere': README.md has no heading with that anchor"),
    ("[spec](../shared/SPEC.md)", "link '../shared/SPEC.md' points outside the repository"),
    ("| a | [gone](docs/gone.md) |\n|---|---|\n| b | c |", "link 'docs/gone.md': no such file"),
    ("`scripts/gone`", "README.md:3: `scripts/gone`: no such file or folder"),
    ("`docs/guide.md::x` and `docs/gone.md`", "`docs/gone.md`: no such file or folder"),
    ("`../shared/SPEC.md`", "`../shared/SPEC.md` points outside the repository"),
    ("set `llmgw:nosuch`", "README.md:3: llmgw:nosuch is no setting the schema declares"),
    ("set llmgw:signer.maxParalel", "llmgw:signer.maxParalel is no setting"),
    ("set `llmgw:vm`", "llmgw:vm is no setting"),  # only the example whose program reads it may name it
])
def test_a_doc_that_names_what_does_not_exist_is_reported(fake_repo: Path, readme: str, found: str) -> None:
    (fake_repo / "README.md").write_text(f"# Fake\n\n{readme}\n")
    problems = all_problems(fake_repo, DECLARED)
    assert len(problems) == 1 and found in problems[0], problems


def test_a_docs_page_and_an_example_readme_are_checked_too(fake_repo: Path) -> None:
    (fake_repo / "docs" / "other.md").write_text("# Other\n\n[gone](gone.md)\n")
    shutil.rmtree(fake_repo / "examples" / "vm")
    (fake_repo / "examples" / "racks").mkdir()
    (fake_repo / "examples" / "racks" / "README.md").write_text("# Racks\n\n[up](../../docs/gone.md)\n")
    problems = all_problems(fake_repo, DECLARED)
    assert sorted(p.split(":")[0] for p in problems) == ["docs/other.md", "examples/racks/README.md"], problems


def sections(path: Path) -> list[tuple[str, str]]:
    """The README's second-level sections in order: (heading text, the Markdown source under it)."""
    toks, lines = tokens(path), path.read_text().splitlines()
    starts = [(toks[i + 1].content, tok.map[0]) for i, tok in enumerate(toks)
              if tok.type == "heading_open" and tok.tag == "h2" and tok.map]
    ends = [line for _, line in starts[1:]] + [len(lines)]
    return [(title, "\n".join(lines[start:end])) for (title, start), end in zip(starts, ends, strict=True)]


def code_blocks(markdown: str) -> list[str]:
    return [t.content for t in PARSER.parse(markdown) if t.type in ("fence", "code_block")]


def test_the_readme_opens_with_an_operators_quick_start_then_real_machines_then_the_lab() -> None:
    titles = [title for title, _ in sections(REPO / "README.md")]
    assert titles[0] == "Quick start", titles
    assert titles.index("Running it against real machines") < titles.index("Develop and test"), titles
    quick = dict(sections(REPO / "README.md"))["Quick start"]
    commands = "\n".join(code_blocks(quick))
    # What an operator runs on their own machine, in order, and none of it as root.
    steps = ["python3 -m venv", "pip install -c constraints.txt", "pulumi login", "pulumi stack init", "pulumi preview"]
    where = [commands.find(step) for step in steps]
    assert -1 not in where and where == sorted(where), dict(zip(steps, where, strict=True))
    assert "sudo" not in quick and "scripts/" not in commands
    develop = dict(sections(REPO / "README.md"))["Develop and test"]
    assert "scripts/local-up" in "\n".join(code_blocks(develop)) and "scripts/test" in "\n".join(code_blocks(develop))


def test_the_section_reader_sees_the_readmes_order(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# T\n\nintro\n\n## Develop and test\n\n```sh\nsudo scripts/test\n```\n\n## Quick start\n\ntext\n")
    assert [t for t, _ in sections(readme)] == ["Develop and test", "Quick start"]
    assert code_blocks(dict(sections(readme))["Develop and test"]) == ["sudo scripts/test\n"]


def test_llmgw_inventory_means_the_node_list_file_only() -> None:
    # The main program reads `llmgw:inventory` as a node list file; no example's own program gives it another
    # meaning (examples/own-program's id -> address map is its own `llmgw:addresses`).
    programs = {p.parent.name: p for p in (REPO / "examples").glob("*/__main__.py")}
    read = {name: set(CONFIG_READ.findall(p.read_text())) for name, p in programs.items()}
    assert "addresses" in read["own-program"]  # the scan sees what an example reads
    assert [name for name, keys in read.items() if "inventory" in keys] == []
    assert "inventory" in declared_settings()


# --------------------------------------------------------------------------- the architecture page

ARCHITECTURE = REPO / "docs" / "architecture.md"
FILES_TO_READ = re.compile(r"^Files to read for (.+) \((\d+)\), in order:$", re.M)


def reading_list(heading: str) -> tuple[int, list[str], list[str]]:
    """For a section of docs/architecture.md: the count its "Files to read" line gives, the files its list names
    in order, and the files its steps name in bold, in the order they first do."""
    section = ARCHITECTURE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = FILES_TO_READ.search(section)
    assert found, f"{heading}: no 'Files to read for ... (N), in order:' line"
    steps, listed = section[:found.start()], section[found.end():].split("\n\n", 2)[1]
    files = re.findall(r"^\d+\. `([^`]+)`$", listed, re.M)
    bold = list(dict.fromkeys(re.findall(r"\*\*`([^`]+)`\*\*", steps)))
    return int(found.group(2)), files, bold


@pytest.mark.parametrize(("heading", "at_most"), [("What `up` does for a new node", 10),
                                                   ("How drift is found and repaired", 5)])
def test_the_architecture_page_answers_from_a_few_files_read_in_order(heading: str, at_most: int) -> None:
    count, files, bold = reading_list(heading)
    assert 0 < len(files) <= at_most, files
    assert count == len(files), f"the page says {count} files and lists {len(files)}"
    assert files == bold, "the list is not the files the steps name in bold, in the order they name them"
    assert [f for f in files if not (REPO / f).is_file()] == []
