"""Static checks CI runs with the tests: ruff over the repository, mypy (strict) over the package."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing():
    done = run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_finds_nothing_in_the_package():
    done = run("mypy", "--no-incremental", "--cache-dir", "/dev/null")  # files and strictness: pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


CI_EXAMPLE = REPO / "examples" / "ci"


def test_actionlint_finds_nothing_in_the_ci_example():
    """actionlint (scripts/actionlint.sh builds it, cached by version; it runs shellcheck over each `run:`)."""
    built = subprocess.run([str(REPO / "scripts" / "actionlint.sh")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    workflows = sorted((CI_EXAMPLE / ".github" / "workflows").glob("*.yml"))
    assert workflows, "no workflow in examples/ci/.github/workflows"
    done = subprocess.run([built.stdout.strip().splitlines()[-1], "-no-color", *map(str, workflows)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gitlab_example_is_well_formed_and_its_scripts_are_shellcheck_clean():
    import yaml

    pipeline = yaml.safe_load((CI_EXAMPLE / ".gitlab-ci.yml").read_text())
    stages = pipeline["stages"]
    jobs = {k: v for k, v in pipeline.items() if isinstance(v, dict) and "script" in v}
    assert set(jobs) == {"preview", "up", "refresh"}, jobs
    assert all(job["stage"] in stages for job in jobs.values())
    for name, job in jobs.items():
        script = "\n".join(["set -eu", *pipeline["default"]["before_script"], *job["script"]])
        done = subprocess.run(["shellcheck", "--shell=sh", "--format=gcc", "-"], input=script, capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stdout)
    sh = sorted(CI_EXAMPLE.glob("*.sh"))
    assert sh
    done = subprocess.run(["shellcheck", "--format=gcc", *map(str, sh)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
