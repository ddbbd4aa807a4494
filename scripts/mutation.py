"""Mutation run over the code that decides trust; see docs/mutation.md. Run it as `scripts/mutation`.

1. mutmut (pinned in pyproject's `mutation` extra) mutates, one change at a time, the functions of each target
   below, and runs against each mutant those of the target's own unit tests that reach the mutated function.
   Each target works in its own copy of the tree (``.mutation/<target>/``), never in the checkout; the mutants
   that timed out are run once more with a longer limit.
2. The mutants the security review found alive (some outside mutmut's reach: module-level constants, a shell
   script) are applied one by one to another copy, and the unit tests are run against each.

Prints, per target, killed/survived/total and every survivor's change. Exit status 0 whatever the score:
this is a report, not a gate (it is not part of scripts/test).
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".mutation"
VENV_BIN = Path(sys.executable).parent
COPIED = ("llmgw_pulumi", "tests", "lab", "pyproject.toml")

PURE_TESTS = ("tests/unit/test_validate.py", "tests/unit/test_validate_config.py", "tests/unit/test_stack_config.py",
              "tests/unit/test_specs.py", "tests/unit/test_host_key.py", "tests/unit/test_providers.py",
              "tests/unit/test_schema.py", "tests/unit/test_agent_settings.py")
"""Pure unit tests of the config and the providers' check and diff: a few seconds in all (with the refusals the
mutation run found no test saying, word for word, in test_specs, test_schema and test_agent_settings)."""


@dataclass(frozen=True)
class Target:
    label: str
    path: str
    patterns: tuple[str, ...]
    """mutmut mutant names (fnmatch) of the functions that are this target."""
    tests: tuple[str, ...]
    """The unit tests its mutants are run against (globs; MUTATION_TESTS, space-separated, replaces them): those
    that exercise it, without the slow ones that only reach it in passing (see docs/mutation.md)."""

    @property
    def work(self) -> Path:
        """Its own copy of the tree: each target is one mutmut run, with its own tests."""
        return WORK / re.sub(r"[^a-z0-9]+", "-", self.label.lower()).strip("-")


def _in(module: str, *functions: str) -> tuple[str, ...]:
    return tuple(f"{module}.*{f}*" for f in functions)


TARGETS = (
    Target("pki.py", "llmgw_pulumi/certificates/pki.py", ("llmgw_pulumi.certificates.pki.*",),
           ("tests/unit/test_pki.py", "tests/unit/test_ca_passphrase.py")),
    Target("cert_policy.py", "llmgw_pulumi/certificates/policy.py", ("llmgw_pulumi.certificates.policy.*",),
           ("tests/unit/test_pki.py",)),
    Target("validate.py", "llmgw_pulumi/validate.py", ("llmgw_pulumi.validate.*",),
           (*PURE_TESTS, "tests/unit/test_validate_messages.py")),
    Target("specs.py (validation)", "llmgw_pulumi/config/specs.py",
           _in("llmgw_pulumi.config.specs", "collect", "x__private_key", "x__any_secret", "check_renewal",
               "x__certificate_connection"), PURE_TESTS),
    Target("schema.py (validation)", "llmgw_pulumi/config/schema.py",
           _in("llmgw_pulumi.config.schema", "collect", "is_unknown", "ǁProblemsǁ", "raise_problems", "x__required",
               "nested_settings", "x_normalise_"), (*PURE_TESTS, "tests/unit/test_diff_decisions.py")),
    Target("agent_settings.py (validation)", "llmgw_pulumi/config/agent_settings.py",
           _in("llmgw_pulumi.config.agent_settings", "collect", "x__on_node"), PURE_TESTS),
    Target("ssh_keys.py (host keys)", "llmgw_pulumi/ssh/keys.py", _in("llmgw_pulumi.ssh.keys", "x_fingerprint_"),
           ("tests/unit/test_host_key.py", "tests/unit/test_host_key_ssh.py")),
    Target("transport.py (host keys)", "llmgw_pulumi/ssh/transport.py",
           _in("llmgw_pulumi.ssh.transport", "x_establish_", "x__open_", "ǁ_checkout_", "ǁsession_",
               "ǁ_open_node_"),
           ("tests/unit/test_host_key.py", "tests/unit/test_host_key_ssh.py", "tests/unit/test_transport_paths.py")),
    Target("release.py (signature, fetch)", "llmgw_pulumi/releases/approval.py",
           _in("llmgw_pulumi.releases.approval", "x_verify_signature_", "x_approve_", "x_fetch_binary_", "x_https_get_",
               "x__opener_", "ǁredirect_request_"),
           ("tests/unit/test_release.py", "tests/unit/test_release_fetch.py")),
    Target("release_policy.py (checksums, pins)", "llmgw_pulumi/releases/policy.py",
           _in("llmgw_pulumi.releases.policy", "x_parse_checksums_", "x_allowed_signers_line_", "x_digests_problem_",
               "x_pins_problem_", "x_pins_for_", "x_verification_"),
           ("tests/unit/test_release.py", "tests/unit/test_release_fetch.py", "tests/unit/test_release_verified.py")),
    Target("fleet_rules.py (release-verified)", "llmgw_pulumi/preview/rules.py",
           _in("llmgw_pulumi.preview.rules", "x_release_verified_"),
           ("tests/unit/test_release_verified.py", "tests/unit/test_review.py")),
    Target("providers (diff)", "llmgw_pulumi/providers/*.py",
           ("llmgw_pulumi.providers.*ǁdiff__*", *_in("llmgw_pulumi.providers.identity", "x_changes_"),
            *_in("llmgw_pulumi.providers.agent", "x_drift_"),
            *_in("llmgw_pulumi.providers.base", "x_changed_keys_", "x_diff_result_", "x_same_machine_")),
           ("tests/unit/test_providers.py", "tests/unit/test_diff_decisions.py", "tests/unit/test_trust.py")),
    Target("decisions.py", "llmgw_pulumi/decisions.py", ("llmgw_pulumi.decisions.*",),
           ("tests/unit/test_decisions.py", "tests/unit/test_providers.py", "tests/unit/test_diff_decisions.py",
            "tests/unit/test_review.py")),
)


@dataclass(frozen=True)
class Replayed:
    """A mutant the security review (../shared/docs/security-review.md) found alive, as a text replacement."""

    where: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


PKI_TESTS = ("tests/unit/test_pki.py", "tests/unit/test_providers_fake.py")
SPECS_TESTS = ("tests/unit/test_specs.py", "tests/unit/test_stack_config.py", "tests/unit/test_providers.py")
REVIEW_MUTANTS = (
    Replayed("pki.py:118 node certificate CA:TRUE", "llmgw_pulumi/certificates/pki.py",
             "x509.BasicConstraints(ca=False, path_length=None)", "x509.BasicConstraints(ca=True, path_length=None)",
             PKI_TESTS),
    Replayed("pki.py:163 EC keys of any size (now: of any curve)", "llmgw_pulumi/certificates/policy.py",
             "if key.curve.name in CURVES:", "if key.curve.key_size >= 0:", PKI_TESTS),
    Replayed("pki.py:163 EC keys of any size (ca1dd75's line)", "llmgw_pulumi/certificates/pki.py",
             "key.curve.key_size >= 256", "key.curve.key_size >= 0", PKI_TESTS),
    Replayed("pki.py:147 MIN_RSA_BITS 512", "llmgw_pulumi/certificates/policy.py", "MIN_RSA_BITS = 2048", "MIN_RSA_BITS = 512",
             PKI_TESTS),
    Replayed("pki.py:213 adoption without clientAuth", "llmgw_pulumi/certificates/policy.py",
             "elif list(purposes.value) != [ExtendedKeyUsageOID.CLIENT_AUTH]:", "elif False:", PKI_TESTS),
    Replayed("pki.py:213 adoption without clientAuth (ca1dd75's line)", "llmgw_pulumi/certificates/pki.py",
             "or ExtendedKeyUsageOID.CLIENT_AUTH not in usage", "or False", PKI_TESTS),
    Replayed("pki.py:214 adoption without not-before", "llmgw_pulumi/certificates/policy.py",
             "if begins > now + CLOCK_SKEW:", "if False:", PKI_TESTS),
    Replayed("pki.py:214 adoption without not-before (ca1dd75's line)", "llmgw_pulumi/certificates/pki.py",
             "or not cert.not_valid_before_utc <= now", "or False", PKI_TESTS),
    Replayed("specs.py:245 private-key marker check removed", "llmgw_pulumi/config/specs.py",
             '(not isinstance(value, str) or "PRIVATE KEY" not in value)', "(not isinstance(value, str))",
             SPECS_TESTS),
    Replayed("install-identity.sh:29 a pending key not the certificate's", "llmgw_pulumi/nodestate/scripts/install-identity.sh",
             'elif [ -f "$R$4" ] && [ "$(spki_of_key "$R$4")" = "$5" ]; then', 'elif [ -f "$R$4" ]; then',
             PKI_TESTS),
)


def targets() -> tuple[Target, ...]:
    """TARGETS, or those whose label starts with one of MUTATION_ONLY's words (e.g. MUTATION_ONLY=pki.py)."""
    only = os.environ.get("MUTATION_ONLY", "").split()
    return tuple(t for t in TARGETS if not only or any(t.label.startswith(o) for o in only))


def tests_to_run(target: Target) -> list[str]:
    given = os.environ.get("MUTATION_TESTS")
    patterns = given.split() if given else target.tests
    return sorted({str(p.relative_to(REPO)) for pattern in patterns for p in REPO.glob(pattern)})


def copy_tree(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        else:
            shutil.copy2(src, dest / name)


UNDER_MUTMUT_NOT = ("tests/unit/test_schema.py::test_adding_an_agent_yaml_option_is_one_declaration",)
"""Tests that cannot run under mutmut: this one copies the package (mutmut's trampolined copy) into a subprocess,
which then fails looking for mutmut's config; its control (the option absent) still runs."""


TIMEOUT_MULTIPLIER = float(os.environ.get("MUTATION_TIMEOUT_MULTIPLIER", "3"))
"""A mutant is stopped after TIMEOUT_MULTIPLIER x (its tests' time + 2 s) of wall clock (twice that of CPU)."""
RETRY_FACTOR = 4
"""The mutants that timed out are run once more with a limit this many times longer: on a busy machine a test
that only ran slowly is then told from one that hangs."""


def mutmut_config(target: Target, tests: list[str], multiplier: float = TIMEOUT_MULTIPLIER) -> str:
    return "\n".join([
        "", "[tool.mutmut]  # written by scripts/mutation",
        'source_paths = ["llmgw_pulumi"]',
        f"only_mutate = {json.dumps([target.path])}",
        'also_copy = ["lab/", "tests/"]',
        # One process per mutant, forked from the one that ran the tests once; no xdist, no cache, a short timeout.
        'pytest_add_cli_args = ["-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-x", "-o", "timeout=60", '
        + ", ".join(f'"--deselect", "{t}"' for t in UNDER_MUTMUT_NOT) + "]",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        "use_git_change_detection = false",
        # A mutant that makes a test loop is stopped after 3 x (its tests' time + 2 s), not mutmut's 15 x.
        f"timeout_multiplier = {multiplier}",
        # Fixtures (a CA made with openssl, a server started) are not in a test's measured time: allow for them.
        "timeout_constant = 2.0",
        "",
    ])


STATUS = {1: "killed", 3: "killed", 37: "killed", 0: "survived", 5: "no tests", 33: "no tests", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}


def results(target: Target) -> dict[str, str]:
    """Every mutant's status, by name, from mutmut's records of ``target``'s run."""
    found: dict[str, str] = {}
    for meta in (target.work / "mutants").rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(fnmatch.fnmatchcase(name, p) for p in target.patterns):
                found[name] = "not run" if code is None else STATUS.get(code, "suspicious")
    return found


def changed_lines(name: str, work: Path, sources: dict[str, dict[str, str]]) -> str:
    """The lines mutant ``name`` changes: its function against mutmut's copy of the original (``__mutmut_orig``)."""
    module, _, function = name.partition(".x")
    path = work / "mutants" / (module.replace(".", "/") + ".py")
    if str(path) not in sources:
        text = path.read_text()
        lines = text.splitlines()
        sources[str(path)] = {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in ast.walk(ast.parse(text))
                              if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    functions = sources[str(path)]
    mutant = "x" + function
    original = mutant.split("__mutmut_")[0] + "__mutmut_orig"
    old, new = (functions.get(n, "").replace(n, "") for n in (original, mutant))
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return "\n".join(f"      {line[:1]} {line[1:].strip()}" for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def run_mutmut(target: Target, children: int) -> None:
    tests = tests_to_run(target)
    print(f"{target.label}: mutants run against {' '.join(tests)}", flush=True)
    copy_tree(target.work)
    project = (REPO / "pyproject.toml").read_text()
    t0 = time.monotonic()
    multiplier = TIMEOUT_MULTIPLIER
    for attempt in range(2):
        (target.work / "pyproject.toml").write_text(project + mutmut_config(target, tests, multiplier))
        log = target.work / f"mutmut-{attempt + 1}.log"
        with log.open("w") as out:
            # A second run with another timeout keeps every verdict but the timeouts, and runs those again.
            rc = subprocess.run([str(VENV_BIN / "mutmut"), "run", "--max-children", str(children), *target.patterns],
                                cwd=target.work, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "TERM": "dumb"}).returncode
        timeouts = sum(status == "timeout" for status in results(target).values())
        print(f"  mutmut: {time.monotonic() - t0:.0f} s, exit {rc}, {timeouts} timeouts at {multiplier:g} x "
              f"(its output: {log})", flush=True)
        if rc != 0 or not timeouts:
            break
        multiplier *= RETRY_FACTOR


def report() -> None:
    print(f"\n{'target':34} {'killed':>7} {'survived':>9} {'other':>6} {'total':>6}  score")
    survivors: list[tuple[Target, list[str]]] = []
    for t in targets():
        mine = results(t)
        killed = sum(s == "killed" for s in mine.values())
        survived = sorted((n for n, s in mine.items() if s == "survived"), key=_natural)
        other = len(mine) - killed - len(survived)
        score = f"{100 * killed / len(mine):.0f}%" if mine else "-"
        print(f"{t.label:34} {killed:7} {len(survived):9} {other:6} {len(mine):6}  {score}")
        survivors.append((t, survived + sorted((f"{n} ({s})" for n, s in mine.items()
                                                      if s not in ("killed", "survived")), key=_natural)))
    sources: dict[str, dict[str, str]] = {}
    for t, names in survivors:
        if names:
            print(f"\nnot killed in {t.label}:")
        for name in names:
            print(f"  {name}")
            print(changed_lines(name.split(" ")[0], t.work, sources))


def _natural(name: str) -> tuple[str, int]:
    head, _, n = name.partition("__mutmut_")
    digits = re.match(r"\d+", n)
    return head, int(digits.group()) if digits else 0


def replay_review_mutants() -> None:
    print("\nthe security review's surviving mutants, replayed against the unit tests:")
    base = WORK / "replay"
    for m in REVIEW_MUTANTS:
        source = (REPO / m.path).read_text()
        if m.old not in source:
            print(f"  n/a       {m.where} (the line is not in this tree)")
            continue
        copy_tree(base)
        (base / m.path).write_text(source.replace(m.old, m.new, 1))
        rc = subprocess.run([str(VENV_BIN / "python"), "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                             "-x", *m.tests, "--ignore=tests/unit/test_static.py", "--ignore=tests/unit/test_bench.py"],
                            cwd=base, capture_output=True, text=True).returncode
        print(f"  {'killed' if rc == 1 else 'SURVIVED' if rc == 0 else f'exit {rc}':9} {m.where}")
    shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    t0 = time.monotonic()
    if os.environ.get("MUTATION_RUN", "1") != "0":  # MUTATION_RUN=0: report the last run's results again
        for target in targets():
            run_mutmut(target, int(os.environ.get("MUTATION_PROCESSES", os.cpu_count() or 2)))
    report()
    if os.environ.get("MUTATION_REPLAY", "1") != "0":
        replay_review_mutants()
    print(f"\nscripts/mutation: {time.monotonic() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
