"""FedBN: federated learning on non-IID features via local batch normalization.

Li, Jiang, Zhang, Kamp, Dou. "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization."
ICLR 2021. https://arxiv.org/abs/2102.07623

Algorithm 1: clients keep their normalization layers local; the server averages everything else as FedAvg
(``w_{t+1} = sum_k (n_k / n) w^k`` for non-BN tensors only).

"Normalization" covers every layer :func:`fedlit.core.roles.is_norm_module` recognises, parameters and buffers (running
statistics): torch's BatchNorm, InstanceNorm, GroupNorm, LayerNorm and RMSNorm, and custom classes found by name
and structure (transformers' ``T5LayerNorm``, ``LlamaRMSNorm``, SAM's ``LayerNorm2d``). Deviation: the paper names
BN only; a transformer's LayerNorm plays the same role and is kept local too. When the model has no trainable
normalization layer, FedBN keeps nothing personal and equals FedAvg; it warns at fit start.
"""

from __future__ import annotations

import warnings

from torch import nn
from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule
from fedlit.strategies.fedavg import FedAvg


def warn_without_trainable_norm(strategy: str, like: str, pl_module: FederatedModule, statistics: bool = False) -> None:
    """Warn that ``strategy`` reduces to ``like`` when ``pl_module`` has no normalization tensor that trains
    (``statistics``: no normalization buffer, i.e. running statistics) under its roles."""
    roles = pl_module.parameter_roles()
    if any(roles.is_norm(n) and r != "frozen" and (roles.is_buffer(n) or not statistics) for n, r in roles.items()):
        return
    backbone = getattr(pl_module, "backbone", None)
    model = type(pl_module).__name__ + (
        f"(backbone={type(backbone).__name__})" if isinstance(backbone, nn.Module) else ""
    )
    kinds = sorted({type(m).__name__ for _, m in pl_module.named_modules() if _ and "norm" in type(m).__name__.lower()})
    why = "frozen, without running statistics, or" if statistics else "frozen or"
    found = (
        f"its normalization-like modules {kinds[:5]} are {why} not recognised by fedlit.core.roles.is_norm_module"
        if kinds
        else "it has no normalization-like module"
    )
    what = "statistics" if statistics else "layer"
    warnings.warn(
        f"{strategy}: the model {model} has no trainable normalization {what} ({found}), so {strategy} keeps "
        f"nothing personal and behaves like {like} here. Give the normalization layers a trainable role "
        f"(model.init_args.roles) or use {like}.",
        stacklevel=2,
    )


class FedBN(FedAvg):
    """FedAvg with every trainable normalization tensor made personal.

    Args:
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    #: What the strategy reduces to when the model has no trainable normalization layer (warned at fit start).
    without_norm: str = "FedAvg"

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """Normalization parameters and buffers that train become ``personal``; frozen ones stay frozen."""
        return roles.replace(lambda name, role: roles.is_norm(name) and role != "frozen", "personal")

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        """Warn when no normalization tensor trains: then nothing is personal and FedBN is FedAvg."""
        super().on_fit_start(trainer, pl_module)  # type: ignore[arg-type]  # fedlit's hooks take its contexts
        warn_without_trainable_norm(type(self).__name__, self.without_norm, pl_module)
