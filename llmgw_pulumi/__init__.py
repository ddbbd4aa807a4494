"""Pulumi dynamic providers that onboard GPU inference nodes into an llmgw cluster.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

chained by the ``Node`` component. See docs/node-contract.md for what must hold on a node
after `pulumi up`, and README.md for how to run it.

A program of your own builds nodes with
``Node(name, NodeArgs(..., connection=ConnectionArgs(...), settings=AgentSettings(servers=[...], ...)))``;
every error it may raise is importable from here.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version

from . import errors
from .agent_settings import AgentSettings, BinarySource, Discovery, Fabric
from .errors import *  # noqa: F403 - every error, as errors.__all__ lists them (its hierarchy)
from .node import ConnectionArgs, Node, NodeArgs, node_settings
from .providers.agent import AgentInstall, AgentInstallArgs
from .providers.certificate import ClientCertificate, ClientCertificateArgs
from .providers.engines import EngineCheck, EngineCheckArgs
from .providers.identity import NodeIdentity, NodeIdentityArgs
from .schema import SettingInfo

try:
    __version__: str = _dist_version("llmgw-pulumi")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    # the component, its resources and their Args
    "Node", "NodeArgs", "ConnectionArgs", "AgentSettings", "Discovery", "Fabric", "BinarySource",
    # every setting of a node, described (for schemas in other languages)
    "node_settings", "SettingInfo",
    "ClientCertificate", "ClientCertificateArgs", "NodeIdentity", "NodeIdentityArgs",
    "AgentInstall", "AgentInstallArgs", "EngineCheck", "EngineCheckArgs",
    "__version__",
]
__all__ += errors.__all__
