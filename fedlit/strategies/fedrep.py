"""FedRep: a shared representation, personal heads trained first in each local turn.

Collins, Hassani, Mokhtari, Shakkottai. "Exploiting Shared Representations for Personalized Federated Learning."
ICML 2021. https://arxiv.org/abs/2102.07078

The model is a representation ``phi`` (the body, shared) and a head ``h_i`` per client (personal). Algorithm 1,
client i's turn at round t, from the server's ``phi^t``:

1. head updates with the representation fixed: ``h_i <- GRD(f_i(h_i, phi^t), h_i, alpha)``, ``tau_h`` times;
2. representation updates with the new head fixed: ``phi_i <- GRD(f_i(h_i, phi_i), phi_i, alpha)``, the rest of
   the turn;

then client i uploads ``phi_i`` only, and the server averages: ``phi^{t+1} = mean_i phi_i``. ``GRD(f, x, alpha)``
is a gradient step on ``f`` with respect to ``x``.

Symbols -> code: ``phi`` -> the shared tensors (``self.global_state``); ``h_i`` -> the tensors matched by ``head``
(``head.*``), made ``personal`` as in :class:`~fedlit.strategies.fedper.FedPer`; ``tau_h`` -> ``head_steps``; the
turn's length -> ``federation.local_steps`` (or ``local_epochs``).

The two phases share the turn's one optimizer: in ``on_before_optimizer_step`` the first ``head_steps`` steps drop
the body's gradients and the later ones the head's (:func:`~fedlit.strategies.fedper.drop_gradients`), and torch's
optimizers skip a parameter without a gradient altogether (no momentum, no weight decay), so the fixed part does
not move. The turn's gradients still flow through the whole model (one backward pass), so phase 1 costs what a
full step costs.

Defaults and deviations:

- The paper's experiments train the head for 10 local epochs and the representation for 1; PFLlib (``FedRep``)
  for ``plocal_epochs=1`` and ``local_epochs=1`` epochs, with two SGD optimizers. fedlit counts optimizer steps
  within the turn the federation sets (so a method's compute per round is the same as FedAvg's): the first
  ``head_steps`` (default 5: half of a 10-step turn, PFLlib's 1:1 split) train the head, the others the body. A
  turn with no step left for the body is refused.
- BatchNorm statistics of the body follow the forward passes of both phases (as in PFLlib, whose model is in
  train mode throughout): they are buffers, with no gradient to drop.
- The paper averages the representations uniformly over the selected clients; PFLlib weighs them by training
  samples, as fedlit does by default (``weighting="uniform"`` gives the paper's mean).
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedper import FedPer, drop_gradients, parameter_names


class FedRep(FedPer):
    """FedPer whose clients train the personal head first (body fixed), then the shared body (head fixed).

    Args:
        head_steps: Optimizer steps at the start of each turn that train the head alone (default 5); the rest of
            the turn trains the body alone.
        head: Glob (or ``re:<regex>``) of the head's names (default ``head.*``: the classifier).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    def __init__(
        self,
        *,
        head_steps: int = 5,
        head: str = "head.*",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(head=head, weighting=weighting, aggregator=aggregator)
        if isinstance(head_steps, bool) or not isinstance(head_steps, int) or head_steps < 1:
            raise ConfigError(
                f"strategy.init_args.head_steps={head_steps!r} must be an int >= 1 (the optimizer steps "
                "of each turn that train the head before the body); use FedPer to train both together."
            )
        self.head_steps = head_steps
        self._head: set[str] = set()
        self._step = 0

    def on_client_fit_start(self, pl_module: FederatedModule, client: ClientContext) -> None:
        """Start the turn in the head phase; refuse a turn of ``local_steps`` that leaves the body no step."""
        steps = client.local.local_steps
        if steps is not None and steps <= self.head_steps:
            raise ConfigError(
                f"FedRep: federation.local_steps={steps} leaves no step to train the body after "
                f"strategy.init_args.head_steps={self.head_steps}: make local_steps larger than "
                "head_steps."
            )
        self._head = parameter_names(pl_module, self.head_rule)
        self._step = 0

    @override
    def on_before_optimizer_step(self, pl_module: FederatedModule) -> None:
        """Phase 1 (the first ``head_steps`` steps): drop the body's gradients; phase 2: drop the head's."""
        head_phase = self._step < self.head_steps
        drop_gradients(pl_module, lambda name: (name in self._head) != head_phase)
        self._step += 1

    def on_client_fit_end(self, client_id: str) -> None:
        """Refuse a turn (of ``local_epochs``) that ended before its body phase began."""
        if self._step <= self.head_steps:
            raise ConfigError(
                f"FedRep: client {client_id!r}'s turn took {self._step} optimizer steps, all spent on "
                f"the head (strategy.init_args.head_steps={self.head_steps}), so its body never trained: "
                "lower head_steps or lengthen the turn (federation.local_steps or local_epochs)."
            )
