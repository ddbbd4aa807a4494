"""scripts/check-commits against a throwaway git repository: the commits that break the commit rules are listed,
each with what it breaks, and no other; the exit status says whether there was one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check-commits"

BODY = "Say why: the reader of the history needs it.\n"
LONG = "Make the subject of this commit one character longer than the rules allow"
GOOD = [
    ("Add a check of commit subjects", BODY),
    ("Address the review's points", BODY),  # ends in "s", an imperative all the same
    ("Process nodes in the order of their ids", BODY),
    ("Bring the docs back in line with the code", BODY),  # ends in "ing"
    ("Embed the fixture in the test", BODY),  # ends in "ed"
    ("Proceed after a failed canary only when asked", BODY),
    ("Focus the review on what a change does to a node", BODY),
    ("Keep a subject of exactly seventy-two characters, which is the limit set", BODY),
    ("Refuse an unknown key", "Why.\n\nSigned-off-by: A Developer <dev@example.com>\n"),
]
BAD = {
    LONG: "73 characters, over 72",
    "Adds a setting": "not in the imperative",
    "Added a setting": "not in the imperative",
    "Adding a setting": "not in the imperative",
    "Fixes the transport": "not in the imperative",
    "docs: the page is rewritten": "capitalised verb",
    "Fix the parser; add a test and rename the module": "joins several changes",
    "Fix the parser.": "ends with a period",
}
NO_BODY = {"Fix the parser": "", "Fix the transport": "Signed-off-by: A Developer <dev@example.com>\n"}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com",
           "GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def commit(repo: Path, subject: str, body: str) -> None:
    git(repo, "commit", "--allow-empty", "--cleanup=verbatim", "-m", subject, *(["-m", body] if body else []))


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True)


def listed(stdout: str) -> dict[str, list[str]]:
    """The script's output as {subject: [what it breaks]}."""
    found: dict[str, list[str]] = {}
    subject = ""
    for line in stdout.splitlines():
        if line.startswith("  - "):
            found[subject].append(line[4:])
        else:
            subject = line.split(" ", 1)[1]
            found[subject] = []
    return found


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose main has one commit with a bad subject (not on the branch under check), and a branch
    `work` checked out from it."""
    git(tmp_path, "init", "-q", "-b", "main")
    commit(tmp_path, "initial commit, before the rules; not checked", "")
    git(tmp_path, "checkout", "-q", "-b", "work")
    return tmp_path


def test_lists_each_commit_that_breaks_a_rule_and_what_it_breaks(repo: Path) -> None:
    assert max(len(s) for s, _ in GOOD) == 72 and len(LONG) == 73  # the limit, from both sides
    for subject, body in GOOD:
        commit(repo, subject, body)
    for subject in BAD:
        commit(repo, subject, BODY)
    for subject, body in NO_BODY.items():
        commit(repo, subject, body)
    done = check(repo, "main")
    assert done.returncode == 1, done.stderr
    found = listed(done.stdout)
    assert set(found) == set(BAD) | set(NO_BODY)
    for subject, why in BAD.items():
        assert len(found[subject]) == 1 and why in found[subject][0], (subject, found[subject])
    for subject in NO_BODY:
        assert found[subject] == ["no body: say why the change is made"]
    total = len(GOOD) + len(BAD) + len(NO_BODY)
    assert f"{len(BAD) + len(NO_BODY)} of {total} commit(s) in main..HEAD" in done.stderr


def test_a_commit_may_break_several_rules_at_once(repo: Path) -> None:
    commit(repo, "updated the docs; also reworded the README and fixed a typo in the changelog.", "")
    found = listed(check(repo, "main").stdout)
    assert [len(v) for v in found.values()] == [5], found


def test_a_branch_that_keeps_the_rules_passes(repo: Path) -> None:
    for subject, body in GOOD:
        commit(repo, subject, body)
    done = check(repo, "main")
    assert (done.returncode, done.stdout) == (0, ""), done.stdout
    assert f"0 of {len(GOOD)} commit(s)" in done.stderr


def test_merges_are_left_out(repo: Path) -> None:
    commit(repo, "Add a check of commit subjects", BODY)
    git(repo, "checkout", "-q", "-b", "side", "main")
    commit(repo, "Add a side change", BODY)
    git(repo, "checkout", "-q", "work")
    git(repo, "merge", "-q", "--no-ff", "--no-edit", "side")  # "Merge branch 'side' into work", no body
    done = check(repo, "main")
    assert (done.returncode, done.stdout) == (0, ""), done.stdout
    assert "0 of 2 commit(s)" in done.stderr


def test_base_defaults_to_origin_main_else_main(repo: Path) -> None:
    commit(repo, "Adds a setting", BODY)
    pushed = git(repo, "rev-parse", "HEAD").strip()
    commit(repo, "Added another setting", BODY)
    assert set(listed(check(repo).stdout)) == {"Adds a setting", "Added another setting"}  # main..HEAD
    git(repo, "update-ref", "refs/remotes/origin/main", pushed)
    done = check(repo)
    assert set(listed(done.stdout)) == {"Added another setting"}
    assert "origin/main..HEAD" in done.stderr


def test_an_unknown_base_is_a_usage_error_naming_the_fix(repo: Path) -> None:
    done = check(repo, "no-such-branch")
    assert (done.returncode, done.stdout) == (2, "")
    assert "'no-such-branch' is not a commit" in done.stderr and "scripts/check-commits BASE" in done.stderr


def test_help_prints_the_usage_and_a_wrong_call_is_a_usage_error(repo: Path) -> None:
    helped = check(repo, "--help")
    assert (helped.returncode, helped.stdout.splitlines()[0]) == (0, "Usage: scripts/check-commits [BASE]")
    wrong = check(repo, "main", "extra")
    assert (wrong.returncode, wrong.stdout) == (2, "") and wrong.stderr.startswith("Usage: scripts/check-commits")


def test_the_script_is_executable_and_ruff_clean() -> None:
    assert os.access(SCRIPT, os.X_OK)
    done = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", str(SCRIPT)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
