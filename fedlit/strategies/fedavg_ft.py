"""FedAvg-FT: Federated Averaging, then local fine-tuning of the global model before each evaluation.

The baseline the personalized federated learning papers set their methods against ("FedAvg + FT"; e.g. Oh, Kim,
Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification", ICLR 2022, Table 3; Luo, Wu,
"Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning" (APPLE), IJCAI 2022): the
federation is FedAvg (McMahan et al., AISTATS 2017) unchanged; a client's personalized model is the global model
``w_t`` after ``finetune_steps`` steps of plain local training on its own train split,
``w_i = w_t - eta sum_s grad F_i(w^(s); B_s)``, and that model is evaluated on its validation and test splits.

The fine-tuning runs at every evaluated round (so the best round is chosen on the fine-tuned models' validation,
as for every personalized method), from what the server holds then, with a fresh optimizer from the module's
``configure_optimizers`` at the round's learning rate, the client's batches in a seeded order, and no strategy
term; nothing of it is kept (:attr:`~fedlit.strategies.base.Strategy.eval_finetune_steps`). The global model
itself is evaluated beside it (``global`` in ``results.json``): FedAvg's own numbers, from the same run. The
steps are counted in ``results.json``'s ``compute`` and by ``fedlit cost``. PFLlib has no FedAvg-FT strategy (it
fine-tunes only new clients); the papers give the number of fine-tuning steps per experiment, so it is an
argument here.
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.fedavg import FedAvg


def check_finetune_steps(steps: int) -> int:
    """``steps`` if it is a positive int, else a ConfigError naming ``strategy.init_args.finetune_steps``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(
            f"strategy.init_args.finetune_steps={steps!r} must be an int >= 1 (the local steps each "
            "client takes from the global model before it is evaluated); use FedAvg for none."
        )
    return steps


class FedAvgFT(FedAvg):
    """FedAvg whose clients are evaluated after fine-tuning the global model on their own train split.

    Args:
        finetune_steps: Local optimizer steps of fine-tuning before each evaluation (default 10).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    def __init__(
        self,
        *,
        finetune_steps: int = 10,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregator=aggregator)
        self.eval_finetune_steps = check_finetune_steps(finetune_steps)

    @override
    def global_model_state(self, client_id: str) -> dict:
        """FedAvg's global model, evaluated beside the fine-tuned one (without fine-tuning)."""
        return dict(self.global_state)
