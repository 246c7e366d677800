"""fedlit: personalized federated fine-tuning of medical foundation models on Lightning + Fabric.

The names below are imported on first use (``fedlit.Federation`` imports torch and Lightning then), so
``import fedlit``, ``fedlit --help`` and ``fedlit --version`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlit.core.roles import ParameterRoles, RoleRule
    from fedlit.core.store import ClientStore
    from fedlit.federation import Federation
    from fedlit.module import FederatedModule
    from fedlit.strategies import ClientUpdate, FedAvg, FedBN, FedProx, Local, Strategy

from fedlit.core.version import __version__ as __version__

_EXPORTS = {
    "ClientStore": "fedlit.core.store",
    "ClientUpdate": "fedlit.strategies",
    "FedAvg": "fedlit.strategies",
    "FedBN": "fedlit.strategies",
    "FedProx": "fedlit.strategies",
    "FederatedModule": "fedlit.module",
    "Federation": "fedlit.federation",
    "Local": "fedlit.strategies",
    "ParameterRoles": "fedlit.core.roles",
    "RoleRule": "fedlit.core.roles",
    "Strategy": "fedlit.strategies",
}
__all__ = [
    "ClientStore",
    "ClientUpdate",
    "FedAvg",
    "FedBN",
    "FedProx",
    "FederatedModule",
    "Federation",
    "Local",
    "ParameterRoles",
    "RoleRule",
    "Strategy",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedlit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
