"""Pulumi dynamic providers that onboard GPU inference nodes into an llmgw cluster.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

chained by the ``Node`` component. See docs/node-contract.md for what must hold on a node
after `pulumi up`, and README.md for how to run it.

A program of your own builds nodes with
``Node(name, NodeArgs(..., connection=ConnectionArgs(...), settings=AgentSettings(servers=[...], ...)))``;
every error it may raise is importable from here.

Importing the package loads neither the Pulumi SDK nor the providers: each name below is imported from its
module when it is first used (tests/unit/test_layering.py), so a tool that reads a preview or checks a config
does not pay for them.
"""

from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from . import errors
from .errors import *  # noqa: F403 - every error, as errors.__all__ lists them (its hierarchy)
from .moved import install as _install_moved

_install_moved()  # the old module paths (moved.MOVED)

if _TYPE_CHECKING:  # what a type checker sees; at run time, _PUBLIC's modules are imported on first use
    from .config.agent_settings import AgentSettings as AgentSettings
    from .config.agent_settings import BinarySource as BinarySource
    from .config.agent_settings import Discovery as Discovery
    from .config.agent_settings import Fabric as Fabric
    from .config.registration import RegistrationCheck as RegistrationCheck
    from .config.schema import SettingInfo as SettingInfo
    from .providers.agent import AgentInstall as AgentInstall
    from .providers.agent import AgentInstallArgs as AgentInstallArgs
    from .providers.certificate import ClientCertificate as ClientCertificate
    from .providers.certificate import ClientCertificateArgs as ClientCertificateArgs
    from .providers.engines import EngineCheck as EngineCheck
    from .providers.engines import EngineCheckArgs as EngineCheckArgs
    from .providers.identity import NodeIdentity as NodeIdentity
    from .providers.identity import NodeIdentityArgs as NodeIdentityArgs
    from .stack.node import ConnectionArgs as ConnectionArgs
    from .stack.node import Node as Node
    from .stack.node import NodeArgs as NodeArgs
    from .stack.node import check_node_args as check_node_args
    from .stack.node import node_settings as node_settings

_PUBLIC = {
    # the component, its resources and their Args
    "Node": ".stack.node", "NodeArgs": ".stack.node", "ConnectionArgs": ".stack.node", "AgentSettings": ".config.agent_settings",
    "Discovery": ".config.agent_settings", "Fabric": ".config.agent_settings", "BinarySource": ".config.agent_settings",
    "RegistrationCheck": ".config.registration",
    # every setting of a node, described (for schemas in other languages)
    "node_settings": ".stack.node", "SettingInfo": ".config.schema",
    # every problem of a node's settings at once, nothing registered
    "check_node_args": ".stack.node",
    "ClientCertificate": ".providers.certificate", "ClientCertificateArgs": ".providers.certificate",
    "NodeIdentity": ".providers.identity", "NodeIdentityArgs": ".providers.identity",
    "AgentInstall": ".providers.agent", "AgentInstallArgs": ".providers.agent",
    "EngineCheck": ".providers.engines", "EngineCheckArgs": ".providers.engines",
}
"""Each public name but the errors, and the module it is imported from when first used."""

try:
    __version__: str = _dist_version("llmgw-pulumi")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [*_PUBLIC, "__version__"]
__all__ += errors.__all__


def __getattr__(name: str) -> _Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # imported once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
