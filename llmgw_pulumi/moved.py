"""The modules that moved when the package was put into folders, and the import hook that keeps their old paths.

A program, a stack or a state written before names a module by its old path (``llmgw_pulumi.stack_config``,
``llmgw_pulumi.providers._glue``): importing it imports the module at its new place, the same module object
(``sys.modules`` holds it under both names), and ``python -m`` runs it. Generated from the move table by the move
script (its MOVES); ``llmgw_pulumi/__init__.py`` installs the hook, which loads nothing until an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

MOVED: dict[str, str] = {
    "llmgw_pulumi.stack_config": "llmgw_pulumi.config.stack_config",
    "llmgw_pulumi.node_list": "llmgw_pulumi.config.node_list",
    "llmgw_pulumi.schema": "llmgw_pulumi.config.schema",
    "llmgw_pulumi.specs": "llmgw_pulumi.config.specs",
    "llmgw_pulumi.agent_settings": "llmgw_pulumi.config.agent_settings",
    "llmgw_pulumi.registration": "llmgw_pulumi.config.registration",
    "llmgw_pulumi.signer_interface": "llmgw_pulumi.config.signer",
    "llmgw_pulumi.desired": "llmgw_pulumi.nodestate.desired",
    "llmgw_pulumi.facts": "llmgw_pulumi.nodestate.facts",
    "llmgw_pulumi.observed": "llmgw_pulumi.nodestate.observed",
    "llmgw_pulumi.plan": "llmgw_pulumi.nodestate.plan",
    "llmgw_pulumi.remote": "llmgw_pulumi.nodestate.commands",
    "llmgw_pulumi.node_health": "llmgw_pulumi.health.parsers",
    "llmgw_pulumi.readiness": "llmgw_pulumi.health.readiness",
    "llmgw_pulumi.transport": "llmgw_pulumi.ssh.transport",
    "llmgw_pulumi.sessions": "llmgw_pulumi.ssh.sessions",
    "llmgw_pulumi.ssh_keys": "llmgw_pulumi.ssh.keys",
    "llmgw_pulumi.ssh_session": "llmgw_pulumi.ssh.connection",
    "llmgw_pulumi.cert_policy": "llmgw_pulumi.certificates.policy",
    "llmgw_pulumi.pki": "llmgw_pulumi.certificates.pki",
    "llmgw_pulumi.signer": "llmgw_pulumi.certificates.signer",
    "llmgw_pulumi.signing": "llmgw_pulumi.certificates.signing",
    "llmgw_pulumi.release_policy": "llmgw_pulumi.releases.policy",
    "llmgw_pulumi.release": "llmgw_pulumi.releases.approval",
    "llmgw_pulumi.fleet_review": "llmgw_pulumi.preview.changes",
    "llmgw_pulumi.fleet_rules": "llmgw_pulumi.preview.rules",
    "llmgw_pulumi.review": "llmgw_pulumi.preview.cli",
    "llmgw_pulumi.review_markdown": "llmgw_pulumi.preview.markdown",
    "llmgw_pulumi.trust_roots": "llmgw_pulumi.preview.trust_roots",
    "llmgw_pulumi.ci": "llmgw_pulumi.preview.ci",
    "llmgw_pulumi.program": "llmgw_pulumi.stack.program",
    "llmgw_pulumi.node": "llmgw_pulumi.stack.node",
    "llmgw_pulumi.component": "llmgw_pulumi.stack.component",
    "llmgw_pulumi.component_host": "llmgw_pulumi.stack.component_host",
    "llmgw_pulumi.component_types": "llmgw_pulumi.stack.component_types",
    "llmgw_pulumi.call_stack": "llmgw_pulumi.stack.call_stack",
    "llmgw_pulumi.shards": "llmgw_pulumi.stack.shards",
    "llmgw_pulumi.config_reference": "llmgw_pulumi.stack.reference",
    "llmgw_pulumi.fleet": "llmgw_pulumi.stack.fleet",
    "llmgw_pulumi.providers._glue": "llmgw_pulumi.providers.base",
}
"""Old module path -> the module's path now."""


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new place."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns what sys.modules holds under the name once this returns: the moved module.
        sys.modules[module.__name__] = importlib.import_module(self.target)

    def get_code(self, fullname: str) -> CodeType:
        # ``python -m <old path>`` (runpy asks for the code): run the module at its new place as __main__.
        return compile(f"import runpy\nrunpy.run_module({self.target!r}, run_name='__main__', alter_sys=True)\n",
                       f"<{fullname}, moved to {self.target}>", "exec")

    def is_package(self, fullname: str) -> bool:
        return False


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        moved = MOVED.get(fullname)
        if moved is None:
            return None
        found = importlib.util.find_spec(moved)  # its file: where the old path's module comes from
        return importlib.machinery.ModuleSpec(fullname, _Alias(moved), origin=found.origin if found else None)


def install() -> None:
    """Keep the old paths importable (once per process; after every other finder, so it is asked last)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
