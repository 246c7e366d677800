"""FedProx-FT: FedProx, then local fine-tuning of the global model before each evaluation.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks", MLSys 2020, for
the federation (Eq. 2's proximal term on the clients, FedAvg on the server), and the fine-tuning of FedAvg-FT
(:mod:`fedlit.strategies.fedavg_ft`) for the evaluation: each client's personalized model is the global model
after ``finetune_steps`` plain local steps on its own train split (no proximal term: the fine-tuned model is the
client's own), at every evaluated round, nothing of it kept. The global model is evaluated beside it.
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import override

from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg_ft import check_finetune_steps
from fedlit.strategies.fedprox import FedProx


class FedProxFT(FedProx):
    """FedProx whose clients are evaluated after fine-tuning the global model on their own train split.

    Args:
        finetune_steps: Local optimizer steps of fine-tuning before each evaluation (default 10).
        mu: Weight of FedProx's proximal term (default 0.01).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    def __init__(
        self,
        *,
        finetune_steps: int = 10,
        mu: float = 0.01,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(mu=mu, weighting=weighting, aggregator=aggregator)
        self.eval_finetune_steps = check_finetune_steps(finetune_steps)

    @override
    def global_model_state(self, client_id: str) -> dict:
        """FedProx's global model, evaluated beside the fine-tuned one (without fine-tuning)."""
        return dict(self.global_state)
