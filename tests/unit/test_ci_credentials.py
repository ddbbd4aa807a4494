"""The CI examples (examples/ci) give a pull request's code no fleet credential and not its own policy config.

Both files are parsed as CI reads them. A job a pull request (GitHub) or a merge request (GitLab) can start
runs the request's code (its program, requirements.txt, config), so whatever that job can reach, the author
of a branch can reach: it may hold read-only access to the state and nothing else, and it must judge the
request by the base branch's rules. Each rule is checked on the shipped files, and each check is shown to
catch its breach on a copy of them with the breach written in (so none of these tests passes vacuously).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
WORKFLOWS = CI / ".github" / "workflows"

READ_ONLY_SECRETS = frozenset({"STATE_READER_KEY_ID", "STATE_READER_SECRET"})
"""The only secrets a pull request's job may name: read access to the state backend (docs/operations.md)."""
BASE = "base/"
"""Where a pull request's job checks out the base branch: its scripts and its policy config."""


# ---------------------------------------------------------------------------------------------- GitHub Actions

def load_workflow(name: str) -> dict[str, Any]:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return dict(workflow)


def triggers(workflow: dict[str, Any]) -> set[str]:
    on = workflow["on"]
    return {on} if isinstance(on, str) else set(on)


_TOKEN = re.compile(r"\s*(\|\||&&|==|!=|\(|\)|'[^']*'|[A-Za-z_][\w.]*)")


def evaluate_if(expression: str, facts: dict[str, str]) -> bool:
    """A job's `if:` for an event, in the small grammar the examples use: `name == 'x'`, `!=`, `||`, `&&` and
    parentheses over the names in ``facts``. Anything else is an error: the test must understand every condition
    it relies on."""
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m:
            raise AssertionError(f"cannot read the condition {expression!r} at {text[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    python = []
    for tok in tokens:
        if tok in ("||", "&&"):
            python.append(" or " if tok == "||" else " and ")
        elif tok in ("==", "!=", "(", ")"):
            python.append(f" {tok} ")
        elif tok.startswith("'"):
            python.append(repr(tok[1:-1]))
        elif tok in facts:
            python.append(repr(facts[tok]))
        else:
            raise AssertionError(f"the condition {expression!r} names {tok}, which this test does not know")
    return bool(eval("".join(python), {"__builtins__": {}}))  # noqa: S307 - tokens checked above


def pull_request_jobs(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The jobs a `pull_request` event runs (they run the pull request's code)."""
    if not triggers(workflow) & {"pull_request", "pull_request_target"}:
        return {}
    facts = {"github.event_name": "pull_request"}
    return {name: job for name, job in workflow["jobs"].items() if "if" not in job or evaluate_if(job["if"], facts)}


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def credential_breaches(workflow: dict[str, Any]) -> list[str]:
    """What a pull request's jobs could reach beyond read-only access to the state."""
    breaches = []
    for level, perms in [("workflow", workflow.get("permissions"))] + [
            (f"job {n}", j.get("permissions")) for n, j in pull_request_jobs(workflow).items()]:
        if perms is None:
            breaches.append(f"{level}: no `permissions` (the default token may write)")
        elif isinstance(perms, str) or any(v not in ("read", "none") for v in perms.values()):
            breaches.append(f"{level}: permissions {perms} give the token write access")
    for name, job in pull_request_jobs(workflow).items():
        if "environment" in job:
            breaches.append(f"job {name}: runs in environment {job['environment']!r}, whose secrets it then holds")
        text = "\n".join([*strings(workflow.get("env")), *strings(job)])
        for secret in sorted(set(re.findall(r"secrets\.([A-Za-z_]\w*)", text)) - READ_ONLY_SECRETS):
            breaches.append(f"job {name}: holds secrets.{secret}")
        for var in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN", "SSH_AUTH_SOCK"):
            if var in text:
                breaches.append(f"job {name}: sets {var}")
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@") and \
                    (step.get("with") or {}).get("persist-credentials") is not False:
                breaches.append(f"job {name}: a checkout leaves the token in .git/config (persist-credentials)")
    return breaches


def policy_breaches(workflow: dict[str, Any]) -> list[str]:
    """A pull request's job must run the base branch's preview script with the base branch's policy config."""
    breaches = []
    for name, job in pull_request_jobs(workflow).items():
        steps = job.get("steps", [])
        bases = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")
                 and (s.get("with") or {}).get("path") == BASE.rstrip("/")]
        if [s["with"].get("ref") for s in bases] != ["${{ github.event.pull_request.base.sha }}"]:
            breaches.append(f"job {name}: {BASE} is not one checkout of the pull request's base commit")
        runs = [s["run"] for s in steps if "run" in s]
        previews = [r for r in runs if "preview.sh" in r]
        if not previews:
            breaches.append(f"job {name}: runs no preview.sh")
        for run in previews:
            words = run.split()
            script = next(w for w in words if w.endswith("preview.sh"))
            if not script.startswith(BASE):
                breaches.append(f"job {name}: runs the pull request's {script}, not the base branch's")
            args = words[words.index(script) + 1:]
            if len(args) < 3 or not args[2].strip('"').startswith(BASE):
                breaches.append(f"job {name}: gives preview.sh no policy config from {BASE}: {run!r}")
        for run in runs:
            if "--policy-pack-config" in run or re.search(r"(?<!base/)stacks/policy", run):
                breaches.append(f"job {name}: reads a policy config of the pull request's: {run!r}")
    return breaches


def comment_breaches(workflow: dict[str, Any]) -> list[str]:
    """The job that posts the summary runs after the pull request's, from the default branch: it may write
    comments, checks out nothing and holds no other secret."""
    breaches = []
    for name, job in workflow["jobs"].items():
        rank = {"none": 0, "read": 1, "write": 2}
        allowed = {"actions": "read", "contents": "read", "pull-requests": "write"}
        perms = job.get("permissions")
        if not isinstance(perms, dict):
            breaches.append(f"job {name}: permissions {perms!r} (give each one)")
            perms = {}
        breaches += [f"job {name}: permission {k}: {v}" for k, v in perms.items()
                     if rank.get(v, 2) > rank[allowed.get(k, "none")]]
        if "environment" in job:
            breaches.append(f"job {name}: runs in environment {job['environment']!r}")
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@"):
                breaches.append(f"job {name}: checks out code")
            if "${{" in step.get("run", ""):
                breaches.append(f"job {name}: an expression inside `run:` (pass it through env)")
        secrets = set(re.findall(r"secrets\.([A-Za-z_]\w*)", "\n".join(strings(job))))
        breaches += [f"job {name}: holds secrets.{s}" for s in sorted(secrets)]
    return breaches


def test_the_workflows_run_on_the_events_the_docs_name():
    fleet, comment = load_workflow("fleet.yml"), load_workflow("fleet-comment.yml")
    assert {"pull_request", "push", "schedule"} <= triggers(fleet)
    assert "pull_request_target" not in triggers(fleet) | triggers(comment)
    assert triggers(comment) == {"workflow_run"}
    assert set(pull_request_jobs(fleet)) == {"preview"}
    push = {"github.event_name": "push"}
    assert [n for n, j in fleet["jobs"].items() if evaluate_if(j["if"], push)] == ["up"]
    assert fleet["jobs"]["up"]["environment"] == "production"


def test_a_pull_request_job_holds_read_access_to_the_state_and_nothing_else():
    fleet = load_workflow("fleet.yml")
    assert credential_breaches(fleet) == []
    # The up job does hold the fleet's credentials: the check would see them in a pull request's job.
    up = fleet["jobs"]["up"]
    assert {"NODES_SSH_KEY", "PULUMI_CONFIG_PASSPHRASE", "PKI_CA_KEY"} <= set(re.findall(r"secrets\.(\w+)", str(up)))


@pytest.mark.parametrize("breach, expected", [
    (lambda w: _preview_run(w)["env"].update({"NODES_SSH_KEY": "${{ secrets.NODES_SSH_KEY }}"}),
     "job preview: holds secrets.NODES_SSH_KEY"),
    (lambda w: w["env"].update({"PULUMI_CONFIG_PASSPHRASE": "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"}),
     "holds secrets.PULUMI_CONFIG_PASSPHRASE"),
    (lambda w: w["jobs"]["preview"]["permissions"].update({"pull-requests": "write"}), "write access"),
    (lambda w: w.update({"permissions": "write-all"}), "workflow: permissions"),
    (lambda w: w["jobs"]["preview"].update({"environment": "production"}), "environment 'production'"),
    (lambda w: w["jobs"]["up"].pop("if"), "job up: holds secrets.NODES_SSH_KEY"),
    (lambda w: w["jobs"]["up"].update({"if": "github.event_name == 'push' || github.event_name == 'pull_request'"}),
     "job up: runs in environment"),
    (lambda w: w["jobs"]["preview"]["steps"][0].pop("with"), "persist-credentials"),
])
def test_the_credential_check_catches_each_breach(breach, expected):
    fleet = copy.deepcopy(load_workflow("fleet.yml"))
    breach(fleet)
    assert any(expected in b for b in credential_breaches(fleet)), credential_breaches(fleet)


def test_a_pull_request_is_judged_by_the_base_branch_s_script_and_rules():
    assert policy_breaches(load_workflow("fleet.yml")) == []


def _preview_run(w: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in w["jobs"]["preview"]["steps"] if "preview.sh" in s.get("run", ""))


@pytest.mark.parametrize("breach, expected", [
    (lambda w: _preview_run(w).update({"run": 'examples/ci/preview.sh "$STACK" "review-$STACK" "base/stacks/policy.$STACK.json"'}),
     "runs the pull request's examples/ci/preview.sh"),
    (lambda w: _preview_run(w).update({"run": 'base/examples/ci/preview.sh "$STACK" "review-$STACK" "stacks/policy.$STACK.json"'}),
     "no policy config from base/"),
    (lambda w: _preview_run(w).update({"run": 'base/examples/ci/preview.sh "$STACK" "review-$STACK"'}),
     "no policy config from base/"),
    (lambda w: w["jobs"]["preview"]["steps"][1]["with"].update({"ref": "${{ github.event.pull_request.head.sha }}"}),
     "not one checkout of the pull request's base commit"),
    (lambda w: w["jobs"]["preview"]["steps"].append({"run": "pulumi preview --policy-pack-config stacks/policy.prod.json"}),
     "reads a policy config of the pull request's"),
])
def test_the_policy_check_catches_each_breach(breach, expected):
    fleet = copy.deepcopy(load_workflow("fleet.yml"))
    breach(fleet)
    assert any(expected in b for b in policy_breaches(fleet)), policy_breaches(fleet)


def test_the_comment_job_posts_text_and_holds_nothing_else():
    comment = load_workflow("fleet-comment.yml")
    assert comment_breaches(comment) == []
    assert comment["jobs"]["comment"]["if"] == "github.event.workflow_run.event == 'pull_request'"
    for breach, expected in [
        (lambda w: w["jobs"]["comment"]["steps"].insert(0, {"uses": "actions/checkout@v6"}), "checks out code"),
        (lambda w: w["jobs"]["comment"]["permissions"].update({"contents": "write"}), "permission contents: write"),
        (lambda w: w["jobs"]["comment"]["steps"][-1]["env"].update({"K": "${{ secrets.NODES_SSH_KEY }}"}),
         "holds secrets.NODES_SSH_KEY"),
        (lambda w: w["jobs"]["comment"]["steps"][-1].update({"run": "gh pr comment ${{ github.event.number }}"}),
         "an expression inside `run:`"),
    ]:
        broken = copy.deepcopy(comment)
        breach(broken)
        assert any(expected in b for b in comment_breaches(broken)), (expected, comment_breaches(broken))


# ---------------------------------------------------------------------------------------------- GitLab CI

PREDEFINED = re.compile(r"CI_\w+|GITLAB_\w*USER\w*")
SHELL = frozenset({"PATH", "PWD", "HOME", "SSH_AUTH_SOCK", "SSH_AGENT_PID"})
"""Variables the shell itself has, or that a job's own commands set (ssh-agent's)."""


def load_pipeline() -> dict[str, Any]:
    return dict(yaml.safe_load((CI / ".gitlab-ci.yml").read_text()))


def gitlab_jobs(pipeline: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each job with what it inherits (`extends`, `default`) folded in."""
    jobs = {}
    for name, job in pipeline.items():
        if not isinstance(job, dict) or "script" not in job:
            continue
        merged: dict[str, Any] = {}
        for parent in job.get("extends", []) if isinstance(job.get("extends"), list) else [job.get("extends")]:
            if parent:
                merged.update(pipeline[parent])
        merged.update(job)
        merged.setdefault("before_script", pipeline.get("default", {}).get("before_script", []))
        jobs[name] = merged
    return jobs


def merge_request_jobs(pipeline: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The jobs a merge request's pipeline runs: no `rules` (conservatively), or a rule whose `if` holds when
    CI_PIPELINE_SOURCE is merge_request_event and CI_COMMIT_BRANCH is unset (as in such a pipeline)."""
    facts = {"github.event_name": ""}  # unused names: the evaluator is shared

    def holds(condition: str) -> bool:
        text = condition.replace('"', "'")
        text = re.sub(r"\$CI_COMMIT_BRANCH\b", "'<unset>'", text)
        text = re.sub(r"\$CI_DEFAULT_BRANCH\b", "'main'", text)
        text = re.sub(r"\$CI_PIPELINE_SOURCE\b", "'merge_request_event'", text)
        return evaluate_if(text, facts)

    return {name: job for name, job in gitlab_jobs(pipeline).items()
            if "rules" not in job or any(holds(rule["if"]) for rule in job["rules"] if "if" in rule)}


def gitlab_breaches(pipeline: dict[str, Any]) -> list[str]:
    """Variables a merge request's job names beyond read access to the state, and a policy config or preview
    script not taken from the target branch."""
    defined = {k for k, v in (pipeline.get("variables") or {}).items() if isinstance(v, (str, int))}
    breaches = []
    for name, job in merge_request_jobs(pipeline).items():
        if "environment" in job:
            breaches.append(f"job {name}: runs in environment {job['environment']!r}")
        local = defined | set(job.get("variables") or {})
        # A variable the job's own commands assign (what they assign it from is checked like the rest).
        local |= {m for line in strings([job.get("before_script"), job["script"]])
                  for m in re.findall(r"^\s*([A-Za-z_]\w*)=", line, flags=re.M)}
        for matrix in (job.get("parallel") or {}).get("matrix", []):
            local |= set(matrix)
        text = "\n".join(strings([job.get("before_script"), job["script"], job.get("variables")]))
        for var in sorted(set(re.findall(r"\$\{?([A-Za-z_]\w*)", text))):
            if var in local or var in SHELL or var in READ_ONLY_SECRETS or PREDEFINED.fullmatch(var):
                continue
            breaches.append(f"job {name}: names ${var}")
        script = "\n".join(strings(job["script"]))
        previews = re.findall(r"(\S*preview\.sh)((?:\s+\S+)*)", script)
        if not previews:
            breaches.append(f"job {name}: runs no preview.sh")
        for path, args in previews:
            if not path.startswith(BASE):
                breaches.append(f"job {name}: runs the merge request's {path}")
            words = args.split()
            if len(words) < 3 or not words[2].strip('"').startswith(BASE):
                breaches.append(f"job {name}: gives preview.sh no policy config from {BASE}")
        if "$CI_MERGE_REQUEST_DIFF_BASE_SHA" not in script:
            breaches.append(f"job {name}: {BASE} is not the merge request's base commit")
        if re.search(r"(?<!base/)stacks/policy", script) or "--policy-pack-config" in script:
            breaches.append(f"job {name}: reads a policy config of the merge request's")
    return breaches


def test_a_merge_request_job_holds_read_access_to_the_state_and_nothing_else():
    pipeline = load_pipeline()
    assert set(merge_request_jobs(pipeline)) == {"preview"}
    assert gitlab_breaches(pipeline) == []
    up = "\n".join(strings(gitlab_jobs(pipeline)["up"]))
    assert "$NODES_SSH_KEY" in up and "$PKI_CA_KEY" in up and "STATE_WRITER" in up  # the check's positive control


@pytest.mark.parametrize("breach, expected", [
    (lambda p: p["default"]["before_script"].append('install -m 600 "$NODES_SSH_KEY" ~/.ssh/id_ed25519'),
     "names $NODES_SSH_KEY"),
    (lambda p: p["preview"]["script"].append('curl -H "PRIVATE-TOKEN: $GITLAB_API_TOKEN" "$CI_API_V4_URL"'),
     "names $GITLAB_API_TOKEN"),
    (lambda p: p["preview"]["script"].insert(0, "export PULUMI_CONFIG_PASSPHRASE=${PULUMI_CONFIG_PASSPHRASE}"),
     "names $PULUMI_CONFIG_PASSPHRASE"),
    (lambda p: p["preview"]["script"].insert(0, 'key=$NODES_SSH_KEY && ssh-add - < "$key"'), "names $NODES_SSH_KEY"),
    (lambda p: p["up"].update({"rules": [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]}), "job up:"),
    (lambda p: p["refresh"].pop("rules"), "job refresh: names $NODES_SSH_KEY"),
    (lambda p: p["preview"].update({"script": [s.replace("base/examples/ci/preview.sh", "examples/ci/preview.sh")
                                               for s in p["preview"]["script"]]}),
     "runs the merge request's examples/ci/preview.sh"),
    (lambda p: p["preview"].update({"script": [s.replace('"base/stacks/policy.$STACK.json"', '"stacks/policy.$STACK.json"')
                                               for s in p["preview"]["script"]]}),
     "no policy config from base/"),
])
def test_the_gitlab_check_catches_each_breach(breach, expected):
    pipeline = copy.deepcopy(load_pipeline())
    breach(pipeline)
    assert any(expected in b for b in gitlab_breaches(pipeline)), gitlab_breaches(pipeline)
