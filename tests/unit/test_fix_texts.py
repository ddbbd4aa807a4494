"""Every setting a fix text names exists: the stack config's keys (`llmgw:ssh.wait`, `hostKey`) and the Args' fields.

The fix is all an operator reads in `pulumi up` output; a fix that names a key
nobody can set (`sshWait`) sends them nowhere. The texts are read from the
source, so a new fix with a misnamed key fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import llmgw_pulumi
from llmgw_pulumi.config import specs, stack_config

PACKAGE = Path(llmgw_pulumi.__file__).parent
SOURCES = sorted([*(PACKAGE / name for name in ("errors.py", "validate.py", "config/stack_config.py", "config/specs.py",
                                                "config/agent_settings.py", "config/schema.py", "stack/program.py",
                                                "certificates/pki.py", "certificates/policy.py", "ssh/transport.py",
                                                "ssh/keys.py", "ssh/connection.py", "config/node_list.py")),
                  *(PACKAGE / "providers").glob("*.py")])

PATHS = stack_config.key_paths()
"""Every stack setting as a dotted path from the top: 'ssh.wait', 'nodes.hostKey'."""
KEY_NAMES = {path.rsplit(".", 1)[-1] for path in PATHS}
ARGS = {name: getattr(llmgw_pulumi, name) for name in llmgw_pulumi.__all__ if name.endswith("Args")}
FIELDS = {f.name for cls in [*ARGS.values(), specs.Connection] for f in dataclasses.fields(cls)}
FIELDS |= {f.name for cls in (specs.AgentSettings, specs.Discovery) for f in dataclasses.fields(cls)}

LLMGW_KEY = re.compile(r"llmgw:([A-Za-z][A-Za-z.]*[A-Za-z])")
ARGS_FIELD = re.compile(r"\b([A-Z][A-Za-z]*Args)\.([a-z_]+)")
DOTTED = re.compile(r"(?<![\w./{}:-])([a-z][A-Za-z]*(?:\.[a-z][A-Za-z]*)+)\b")
CAMEL = re.compile(r"(?<![\w.:-])[a-z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b")
SNAKE = re.compile(r"(?<![\w./-])[a-z]+(?:_[a-z]+)+\b")
NOT_SETTINGS = {"known_hosts", "replace_with"}
"""Words shaped like a setting that name something else (a file every SSH user knows, a Pulumi resource option)."""


def unknown_keys(text: str) -> list[str]:
    """The settings ``text`` names that do not exist."""
    bad = [m for m in LLMGW_KEY.findall(text) if m not in PATHS]
    bad += [f"{cls}.{f}" for cls, f in ARGS_FIELD.findall(text)
            if cls not in ARGS or f not in {x.name for x in dataclasses.fields(ARGS[cls])}]
    bad += [m for m in DOTTED.findall(text) if m.split(".")[0] in stack_config.TOP_KEYS | stack_config.NODE_KEYS
            and m not in PATHS and f"nodes.{m}" not in PATHS]
    bad += [m for m in CAMEL.findall(text) if m not in KEY_NAMES]
    bad += [m for m in SNAKE.findall(text) if m not in FIELDS | NOT_SETTINGS]
    return bad


def literal(node: ast.expr) -> str | None:
    """The text of a string literal, an f-string (its fields as {}) or a concatenation of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal(node.left), literal(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.IfExp):
        return " / ".join(t for t in (literal(node.body), literal(node.orelse)) if t is not None) or None
    return None


def fix_texts(source: Path) -> list[tuple[str, str]]:
    """(where, text) of each fix in ``source``: errors' ``fix=`` (in their class statement, or assigned), the last
    argument of ``Problems.add``, of the package's errors and of a pattern validator, and the second half of a
    validator's (problem, fix)."""
    found: list[tuple[ast.AST, ast.expr]] = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "fix" for t in node.targets):
            found.append((node, node.value))
        elif isinstance(node, ast.ClassDef):  # class XError(LlmgwError, fix="...")
            found += [(node, k.value) for k in node.keywords if k.arg == "fix"]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if (name in ("add", "_matching") or name.endswith("Error")) and len(node.args) >= 3:
                found.append((node, node.args[-1]))
            found += [(node, k.value) for k in node.keywords if k.arg == "fix"]
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) == 2:
            found.append((node, node.value.elts[1]))
    texts = [(f"{source.name}:{node.lineno}", literal(expr)) for node, expr in found]  # type: ignore[attr-defined]
    return [(where, text) for where, text in texts if text]


FIXES = [fix for source in SOURCES for fix in fix_texts(source)]


def test_the_fix_texts_are_found() -> None:
    by_file = {where.split(":")[0] for where, _ in FIXES}
    assert {"errors.py", "validate.py", "stack_config.py", "specs.py", "agent_settings.py", "program.py", "keys.py",
            "connection.py"} <= by_file
    assert len(FIXES) > 60
    assert ("raise llmgw:ssh.wait (ConnectionArgs.wait) for slow boots" in
            next(text for where, text in FIXES if text.startswith("check the address, that sshd runs")))


@pytest.mark.parametrize("text,bad", [
    ("raise sshWait for slow boots", ["sshWait"]),
    ("or fix sshUser/sshKey", ["sshUser", "sshKey"]),
    ("set llmgw:ssh.privateKeyFile", ["ssh.privateKeyFile"]),
    ("set llmgw:sshKey", ["sshKey"]),
    ("raise ssh.timeout", ["ssh.timeout"]),
    ("check agent.releaseURL", ["agent.releaseURL"]),
    ("raise ConnectionArgs.timeout", ["ConnectionArgs.timeout"]),
    ("give private_key_file", ["private_key_file"]),
    ("raise llmgw:ssh.wait (ConnectionArgs.wait); set the node's hostKey, agent.releaseUrl, "
     "fabric.hcas, engines.vllm.bin or private_key_path; see ~/.ssh/authorized_keys and gpu01.example.net", []),
], ids=["camel", "two camel", "llmgw path", "llmgw key", "dotted", "dotted camel", "args field", "snake", "all valid"])
def test_a_misnamed_key_is_caught(text: str, bad: list[str]) -> None:
    assert unknown_keys(text) == bad


@pytest.mark.parametrize("where,text", FIXES, ids=[where for where, _ in FIXES])
def test_every_key_a_fix_names_exists(where: str, text: str) -> None:
    assert unknown_keys(text) == [], f"{where}: {text!r} names settings that do not exist"


def test_no_fix_calls_a_path_on_the_operators_machine_a_path_on_the_node() -> None:
    # pkiDir, ssh.privateKeyPath and agent.binary are read on the machine running Pulumi.
    from llmgw_pulumi import validate

    for what in ("PKI directory", "path of the SSH private key", "local binary path"):
        problem = validate.abs_path("relative/path", what)
        assert problem is not None and "on the node" not in problem[1]
