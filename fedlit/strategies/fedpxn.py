"""FedPxN: Federated learning with Proximal regularization eXcept local Normalization.

Yang, Hwang, Kim, Dua, Kim, Yang, Choi. "Towards the Practical Utility of Federated Learning in the Medical
Domain." CHIL 2023 (PMLR 209). https://arxiv.org/abs/2207.03075

FedPxN = FedBN + FedProx. Normalization layers (parameters and running statistics) stay personal, as in FedBN
(Li et al., ICLR 2021, Algorithm 1); every other shared tensor is averaged as FedAvg, and the client objective
adds FedProx's proximal term (Li et al., MLSys 2020, Eq. 2) over the shared, non-normalization parameters only:

    (1)  h_k(w; w^t) = F_k(w) + (mu / 2) ||w_s - w_s^t||^2,    w_s = the shared non-normalization parameters,

with the squared Euclidean norm and ``mu = 0.01``.

Symbols -> code: ``w_s^t`` -> ``self._anchor`` (what the server sent this round: FedBN's roles leave
normalization tensors out of it); ``mu`` -> ``self.mu``; ``F_k`` -> the module's loss.

Decision (``prox_on_norm_initial``): the authors' code, through a string typo in the
name filter, also puts the normalization parameters into the proximal term, anchored to the server model's
normalization values, which the server never updates (FedBN keeps them local): they are pulled toward their
initial values for the whole run. The default (``False``) implements the paper, Eq. (1). ``True`` reproduces
the code: (mu / 2) ||w_n - w_n^0||^2 is added, ``w_n`` the trainable normalization parameters (not the running
statistics, which are buffers) and ``w_n^0`` their values before round 1, kept in the server state.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor
from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedbn import FedBN
from fedlit.strategies.fedprox import FedProx


class FedPxN(FedBN, FedProx):
    """FedBN's roles (normalization personal) with FedProx's proximal term on what stays shared.

    Args:
        mu: Weight of the proximal term (default 0.01).
        prox_on_norm_initial: ``False`` (the paper): normalization layers are left out of the proximal term.
            ``True`` (the authors' code): their trainable parameters are also pulled toward their initial values.
        weighting: As in :class:`FedAvg`.
        aggregator: As in :class:`FedAvg` (default: the weighted mean).
    """

    without_norm = "FedProx"

    def __init__(
        self,
        *,
        mu: float = 0.01,
        prox_on_norm_initial: bool = False,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        # FedBN has no constructor of its own: through the MRO (FedPxN -> FedBN -> FedProx -> FedAvg) this is
        # FedProx's, which sets mu and FedAvg's weighting and aggregator.
        super().__init__(mu=mu, weighting=weighting, aggregator=aggregator)
        if not isinstance(prox_on_norm_initial, bool):
            raise ConfigError(
                f"strategy.init_args.prox_on_norm_initial={prox_on_norm_initial!r} must be true or false."
            )
        self.prox_on_norm_initial = prox_on_norm_initial
        self._norm_initial: dict[str, Tensor] = {}

    @override
    def setup_server_state(self) -> None:
        """A new run: forget any normalization values kept from an earlier one (see :meth:`on_fit_start`)."""
        super().setup_server_state()
        self._norm_initial = {}

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        """With ``prox_on_norm_initial``, keep the trainable normalization parameters' values before round 1
        (the live model holds them on a new run; a resumed run has them from the checkpoint)."""
        super().on_fit_start(trainer, pl_module)
        if not self.prox_on_norm_initial or self._norm_initial:
            return
        roles = pl_module.parameter_roles()
        self._norm_initial = {
            n: p.detach().cpu().clone()
            for n, p in pl_module.named_parameters()
            if roles.is_norm(n) and roles[n] != "frozen"
        }

    @override
    def on_client_fit_start(self, received: dict[str, Tensor]) -> None:
        """Anchor the proximal term at what the server sent (and, with ``prox_on_norm_initial``, at the
        normalization parameters' initial values)."""
        super().on_client_fit_start(received=received)
        self._anchor.update(self._norm_initial)

    @override
    def proximal_parameters(self, pl_module: FederatedModule) -> dict[str, Tensor]:
        """The shared parameters (never normalization ones: FedBN made them personal), plus, with
        ``prox_on_norm_initial``, the trainable normalization parameters."""
        params = super().proximal_parameters(pl_module)
        if self._norm_initial:
            params.update((n, p) for n, p in pl_module.named_parameters() if n in self._norm_initial)
        return params

    @override
    def state_dict(self) -> dict[str, Any]:
        """The server state plus the normalization parameters' initial values (empty unless
        ``prox_on_norm_initial``)."""
        return {**super().state_dict(), "norm_initial": dict(self._norm_initial)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self._norm_initial = dict(state_dict["norm_initial"])

    @override
    def hparams(self) -> dict[str, Any]:
        """The arguments, ``prox_on_norm_initial`` last (as earlier versions wrote it: a resume compares the
        repr)."""
        hparams = super().hparams()
        hparams["prox_on_norm_initial"] = hparams.pop("prox_on_norm_initial", self.prox_on_norm_initial)
        return hparams
