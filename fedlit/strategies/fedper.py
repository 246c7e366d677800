"""FedPer: federated learning with personalization layers.

Arivazhagan, Aggarwal, Singh, Choudhary. "Federated Learning with Personalization Layers." arXiv 2019.
https://arxiv.org/abs/1912.00818

The model is split into base layers ``W_B`` (shared) and personalization layers ``W_{P_j}`` of client j (kept on
the client, never uploaded). Server: ``W_B <- sum_j (n_j / n) W_{B,j}``, FedAvg on the base layers alone; client j:
SGD on both ``W_B`` and ``W_{P_j}`` for ``e`` local epochs, then upload ``W_{B,j}``.

Symbols -> code: ``W_B`` -> the shared tensors (``self.global_state``); ``W_{P_j}`` -> the tensors matched by
``head`` (the classifier, ``head.*`` in :class:`~fedlit.tasks.ClassificationModule`), made ``personal`` and kept
in the client store; ``n_j`` -> ``update.num_examples``.

The paper keeps the last ``K_P`` layers personal (1 or 2 in its experiments); PFLlib (``FedPer``) keeps the model's
``head`` (the last linear layer), as fedlit does by default; a wider ``head`` glob (``re:`` for a regular
expression, as in :class:`~fedlit.core.roles.RoleRule`) keeps more. Tensors frozen by the model's roles stay
frozen. The helpers of this module (:func:`head_rule`, :func:`head_names`, :func:`drop_gradients`) serve the other
head/body strategies: LG-FedAvg, FedRep, FedBABU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.roles import ParameterRoles, RoleRule
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg


def head_rule(head: str) -> RoleRule:
    """The rule that selects the head's tensors by ``head``, a glob or ``re:<regex>`` on the qualified name; a
    ConfigError naming ``strategy.init_args.head`` when it is not valid."""
    if not isinstance(head, str) or not head:
        raise ConfigError(
            f"strategy.init_args.head={head!r} must be a non-empty glob on the parameter names (the "
            "classifier of fedlit.tasks.ClassificationModule is 'head.*')."
        )
    try:
        return RoleRule(head, "personal")
    except ValueError as err:
        raise ConfigError(f"strategy.init_args.head={head!r}: {err}") from None


def head_names(roles: ParameterRoles, rule: RoleRule, strategy: str) -> list[str]:
    """The names (parameters and buffers) matched by ``rule`` whose role is not ``frozen``; a ConfigError when they
    hold no parameter (the strategy would have no head to treat apart)."""
    names = [n for n in rule.select(list(roles)) if roles[n] != "frozen"]
    if not any(not roles.is_buffer(n) for n in names):
        trainable = roles.names("shared", "personal", buffers=False)
        raise ConfigError(
            f"strategy.init_args.head={rule.pattern!r} matches no trainable parameter of the model, so {strategy} "
            f"has no head to treat apart from the body. Give the glob of the classifier's parameters (trainable "
            f"parameters look like {trainable[-3:]}; fedlit.tasks.ClassificationModule's classifier is 'head.*')."
        )
    return names


def drop_gradients(pl_module: FederatedModule, drop: Callable[[str], bool]) -> None:
    """Set the gradient of every parameter of ``pl_module`` whose name satisfies ``drop`` to None: torch's
    optimizers skip such a parameter entirely (no momentum, no weight decay), so the step leaves it unchanged."""
    for name, param in pl_module.named_parameters():
        if param.grad is not None and drop(name):
            param.grad = None


def parameter_names(pl_module: FederatedModule, rule: RoleRule) -> set[str]:
    """The names of ``pl_module``'s parameters matched by ``rule``."""
    return {n for n, _ in pl_module.named_parameters() if rule.matches(n)}


class FedPer(FedAvg):
    """FedAvg on the base layers; the head (personalization layers) stays personal.

    Args:
        head: Glob (or ``re:<regex>``) of the personalization layers' names (default ``head.*``: the classifier).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    fusable = True

    def __init__(
        self,
        *,
        head: str = "head.*",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.head = head
        self.head_rule = head_rule(head)

    @override
    def configure_roles(self, roles: ParameterRoles) -> ParameterRoles:
        """The head's trainable tensors become ``personal``; the body keeps its roles (shared, usually)."""
        return roles.with_roles(dict.fromkeys(head_names(roles, self.head_rule, type(self).__name__), "personal"))
