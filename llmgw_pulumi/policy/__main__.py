"""The llmgw policy pack: each rule of llmgw_pulumi.preview.rules as a pulumi-policy policy.

Per stack, a policy config file (``pulumi preview --policy-pack-config FILE``)
sets each rule's enforcement level and parameters:
``{"certificate-validity": {"enforcementLevel": "mandatory", "maxHours": 720}}``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from llmgw_pulumi import child_env
from llmgw_pulumi.preview import changes, rules, trust_roots

LEVELS = {"advisory": EnforcementLevel.ADVISORY, "mandatory": EnforcementLevel.MANDATORY,
          "disabled": EnforcementLevel.DISABLED}


def known(value: Any) -> Any:
    """A plain copy of a resource's props (``rules.plain``)."""
    return rules.plain(value, UnknownValueError)


def schema(rule: rules.Rule) -> PolicyConfigSchema | None:
    if not rule.params:
        return None
    return PolicyConfigSchema({name: {"type": type_, "default": default, "description": what}
                               for name, (type_, default, what) in rule.params.items()})


def resource_policy(rule: rules.Rule, check: Callable[[str, Mapping[str, Any], Mapping[str, Any]], str | None]) \
        -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        message = check(changes.kind_of(args.urn), known(args.props), args.get_config())
        if message:
            report_violation(message, None)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=LEVELS[rule.enforcement], config_schema=schema(rule))


def deployed() -> list[rules.Resource]:
    """The stack's last deployment (`pulumi stack export`): the engine gives a policy pack only the new state."""
    stack = "/".join(os.environ.get(k, "") for k in ("PULUMI_ORGANIZATION", "PULUMI_PROJECT", "PULUMI_STACK"))
    if not os.environ.get("PULUMI_ORGANIZATION"):
        stack = "organization/" + stack.lstrip("/")  # a file backend names no organization
    done = subprocess.run(["pulumi", "stack", "export", "--stack", stack, "--non-interactive"],
                          capture_output=True, text=True, check=False, env=child_env.for_child(backend=True))
    if done.returncode != 0:
        raise RuntimeError(f"llmgw policy pack: `pulumi stack export --stack {stack}` failed: {done.stderr.strip()}")
    return rules.resources_of(json.loads(done.stdout).get("deployment") or {})


@functools.cache
def deployed_inputs() -> dict[str, Mapping[str, Any]]:
    """Each deployed resource's recorded inputs, by URN (one `pulumi stack export` per run of the pack)."""
    return {r.urn: r.props for r in deployed()}


def pki_dir_ca(pki_dir: Any) -> str | None:
    """The fingerprint of pkiDir's ca.pem as this machine reads it (None: it cannot be read here)."""
    try:
        return trust_roots.pem_sha256(Path(pki_dir, "ca.pem").read_text()) if isinstance(pki_dir, str) else None
    except OSError:
        return None


def trust_roots_policy() -> ResourceValidationPolicy:
    """trust-roots-unchanged: each resource's new inputs (what the engine gives a resource policy, checked) against
    its recorded ones."""
    rule = rules.TRUST_ROOTS_UNCHANGED

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if os.environ.get("PULUMI_DRY_RUN") != "true":
            return  # while `up` applies steps the deployment is half the new state: the preview before it judged
        kind = changes.kind_of(args.urn)
        if kind not in (changes.CERTIFICATE, changes.IDENTITY, changes.AGENT, changes.ENGINES):
            return
        props = known(args.props)
        if kind == changes.CERTIFICATE:
            props = trust_roots.ca_as_read(props, pki_dir_ca(props.get("pki_dir")))
        for message in rules.trust_roots_unchanged(kind, deployed_inputs().get(args.urn), props, args.get_config()):
            report_violation(message, None)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=LEVELS[rule.enforcement], config_schema=schema(rule))


def stack_policy(rule: rules.Rule, check: Callable[[list[rules.Resource], list[rules.Resource], Mapping[str, Any]],
                                                  list[tuple[str, str]]]) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        if os.environ.get("PULUMI_DRY_RUN") != "true":
            return  # after `up` the deployment is the new state: the preview before it judged the change
        planned = [rules.Resource(changes.kind_of(r.urn), r.name, known(r.props), r.urn) for r in args.resources]
        for urn, message in check(deployed(), planned, args.get_config()):
            report_violation(message, urn)

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                 enforcement_level=LEVELS[rule.enforcement], config_schema=schema(rule))


PolicyPack(
    name="llmgw-fleet",
    policies=[
        resource_policy(rules.HOST_KEYS_PINNED, lambda kind, props, _: rules.host_key_pinned(kind, props)),
        resource_policy(rules.NO_OPERATOR_KEYS, lambda kind, props, _: rules.no_operator_key(kind, props)),
        resource_policy(rules.CERTIFICATE_VALIDITY, rules.certificate_validity),
        resource_policy(rules.RELEASE_VERIFIED, rules.release_verified),
        stack_policy(rules.ROLLOUT_REQUIRED, rules.rollout_required),
        stack_policy(rules.REMOVAL_ALLOWED, rules.removal_allowed),
        trust_roots_policy(),
    ],
)
