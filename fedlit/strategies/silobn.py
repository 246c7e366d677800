"""SiloBN: local normalization statistics, shared normalization parameters.

Andreux, Ogier du Terrail, Beguier, Tramel. "Siloed Federated Learning for Multi-Centric Histopathology
Datasets." MICCAI 2020 workshops (DART / DCL), LNCS 12444. https://arxiv.org/abs/2008.07424

Sec. 3 (local-statistic BatchNorm): a BN layer computes ``y = gamma * (x - mu_k) / sqrt(sigma_k^2 + eps) + beta``;
the activation statistics ``mu_k, sigma_k^2`` of center k stay in center k (they are never uploaded, and each
center evaluates with its own), while the learned ``gamma, beta`` are averaged by the server with every other
weight, as FedAvg (``w_{t+1} = sum_k (n_k / n) w^k``).

Symbols -> code: ``mu_k, sigma_k^2`` -> the normalization buffers ``running_mean``, ``running_var`` (and
``num_batches_tracked``), made ``personal``; ``gamma, beta`` -> the normalization parameters ``weight``,
``bias``, left ``shared``; ``w^k`` -> ``update.state``; ``n_k`` -> ``update.num_examples``.

"Normalization" covers the layers :func:`fedlit.core.roles.is_norm_module` recognises (BatchNorm, InstanceNorm,
GroupNorm, LayerNorm, custom norm classes by name and structure); only those with buffers (BatchNorm,
InstanceNorm with running statistics) have statistics to keep local, so for GroupNorm/LayerNorm SiloBN equals
FedAvg, and it warns at fit start. Frozen normalization layers (a frozen pretrained backbone) stay frozen.

Deviation: the paper names BatchNorm only; the rule is applied to every normalization buffer.
"""

from __future__ import annotations

from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.roles import ParameterRoles
from fedlit.module import FederatedModule
from fedlit.strategies.fedavg import FedAvg
from fedlit.strategies.fedbn import warn_without_trainable_norm


class SiloBN(FedAvg):
    """FedAvg with the statistics of trainable normalization layers kept personal.

    Args:
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """Normalization buffers (running statistics) that are not frozen become ``personal``; normalization
        parameters (affine ``weight``/``bias``) keep their role, ``shared`` in the usual setting."""
        return roles.replace(
            lambda name, role: roles.is_norm(name) and roles.is_buffer(name) and role != "frozen", "personal"
        )

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        """Warn when no normalization statistics train: then nothing is personal and SiloBN is FedAvg."""
        super().on_fit_start(trainer, pl_module)  # type: ignore[arg-type]  # fedlit's hooks take its contexts
        warn_without_trainable_norm(type(self).__name__, "FedAvg", pl_module, statistics=True)
