"""FedBABU: federated training of the body alone, the head fixed at its initialization, fine-tuned before evaluation.

Oh, Kim, Yun. "FedBABU: Toward Enhanced Representation for Federated Image Classification." ICLR 2022.
https://arxiv.org/abs/2106.06042

The model is a body ``theta_ext`` (the feature extractor) and a head ``theta_cls`` (the classifier). The head is
initialized once, identically for every client, and never updated during federated training; each client updates
only the body, ``theta_ext <- theta_ext - eta grad_{theta_ext} L_i(theta_ext, theta_cls^0)``, and
the server averages the bodies as FedAvg, ``theta_ext^{t+1} = sum_i (n_i / n) theta_ext,i``. For evaluation each
client fine-tunes the whole model (body and head: the paper's default, which its experiments found better than
fine-tuning the head or the body alone) on its own training data, from the global body and the initial head,
for ``tau_f`` steps, and that personalized model is evaluated.

Symbols -> code: ``theta_ext`` -> the shared tensors (``self.global_state``); ``theta_cls^0`` -> the tensors matched
by ``head`` (``head.*``), whose role is ``personal``: each client keeps its copy in the client store, which starts
from the model's one initialization and never changes during federation (``on_before_optimizer_step`` drops the
head's gradients, and torch's optimizers skip a parameter without a gradient: no momentum, no weight decay), so
the head is never sent nor uploaded; ``tau_f`` -> ``finetune_steps``, run by the federation before every
evaluation (:attr:`~fedlit.strategies.base.Strategy.eval_finetune_steps`: a fresh optimizer over every trainable
parameter, head included, at the round's learning rate; nothing of it is kept). The global model (the averaged
body with the initial head, not fine-tuned) is evaluated beside, under ``global`` in ``results.json``.

Defaults and deviations:

- ``finetune_steps`` defaults to 10 (fedlit counts steps; PFLlib's ``fine_tuning_epochs`` default is 10 epochs).
- PFLlib (``FedBABU``) fine-tunes once, after the last round; fedlit fine-tunes at every evaluated round, so that
  the best round is chosen on the fine-tuned models' validation, as for every personalized method here.
- ``finetune_from: global`` (the default) fine-tunes from the global body and the initial head: the paper's
  personalization fine-tunes the global model, as the authors' code does (``jhoon-oh/FedBABU``: every client
  loads the saved global model, ``best_model.pt``, and fine-tunes it). PFLlib (``FedBABU``) fine-tunes each
  client's own model as its last turn left it: it sends nothing after the last aggregation, so a client of the
  last round fine-tunes the body it trained (a client outside it, the global body it was sent).
  ``finetune_from: local`` follows PFLlib: each client keeps the body it uploaded after its last turn
  (``client_state["body"]``, put over the received global body by :meth:`FedBABU.on_client_evaluate_start`; a
  client that has not trained yet starts from the global body) and fine-tunes it with the initial head. Under
  partial participation, fedlit's client outside the last round fine-tunes the body of its own last turn where
  PFLlib's fine-tunes the global body it was sent. Memory: one body per client in the store.
- ``finetune: head`` fine-tunes the head alone (the paper's ablation; PFLlib's
  ``fine_tune(which_module=["head"])``): :meth:`FedBABU.configure_eval_finetune` keeps only the head's parameters
  in the module's optimizer.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from typing_extensions import override

from fedlit.core.contexts import ClientContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule
from fedlit.strategies.base import ClientUpdate
from fedlit.strategies.common.aggregators import Aggregator
from fedlit.strategies.common.personal_copy import load_into
from fedlit.strategies.fedavg_ft import check_finetune_steps
from fedlit.strategies.fedper import FedPer, drop_gradients, parameter_names


class FedBABU(FedPer):
    """FedAvg on the body with the head fixed at its initialization; each client fine-tunes the whole model before
    it is evaluated.

    Args:
        finetune_steps: Local optimizer steps of fine-tuning before each evaluation (default 10).
        finetune: What they train: ``whole`` (body and head, the paper's default) or ``head``.
        finetune_from: The body they start from: ``global`` (the global body: the paper's, the default) or
            ``local`` (the body of the client's own last turn: PFLlib's).
        head: Glob (or ``re:<regex>``) of the head's names (default ``head.*``: the classifier).
        weighting: As in :class:`~fedlit.strategies.fedavg.FedAvg`.
        aggregator: As in :class:`~fedlit.strategies.fedavg.FedAvg` (default: the weighted mean).
    """

    def __init__(
        self,
        *,
        finetune_steps: int = 10,
        finetune: Literal["whole", "head"] = "whole",
        finetune_from: Literal["global", "local"] = "global",
        head: str = "head.*",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        aggregator: Aggregator | None = None,
    ) -> None:
        super().__init__(head=head, weighting=weighting, aggregator=aggregator)
        self.eval_finetune_steps = check_finetune_steps(finetune_steps)
        if finetune not in ("whole", "head"):
            raise ConfigError(
                f"strategy.init_args.finetune={finetune!r} is not one of 'whole' (body and head, the "
                "paper's default), 'head'."
            )
        if finetune_from not in ("global", "local"):
            raise ConfigError(
                f"strategy.init_args.finetune_from={finetune_from!r} is not one of 'global' (the global body, the "
                "paper's), 'local' (the body of the client's own last turn, PFLlib's)."
            )
        self.finetune, self.finetune_from = finetune, finetune_from
        self._head: set[str] = set()

    def on_client_fit_start(self, pl_module: FederatedModule) -> None:
        """Find the head's parameters, whose gradients every step of the turn drops."""
        self._head = parameter_names(pl_module, self.head_rule)

    @override
    def on_before_optimizer_step(self, pl_module: FederatedModule) -> None:
        """Drop the head's gradients: the head stays at its initialization during federation."""
        drop_gradients(pl_module, self._head.__contains__)

    def on_client_fit_end(self, update: ClientUpdate, client_state: dict[str, Any], client: ClientContext) -> None:
        """``finetune_from: local``: keep the body the client uploads, to fine-tune from before its evaluations."""
        if self.finetune_from == "local":
            device = client.store.device
            client_state["body"] = {n: t.detach().to(device, copy=True) for n, t in update.state.items()}

    @override
    def on_client_evaluate_start(self, pl_module: FederatedModule, client_state: dict[str, Any]) -> None:
        """``finetune_from: local``: put the body of the client's last turn over the received global body (a
        client that has not trained yet keeps the global body)."""
        if self.finetune_from == "local" and "body" in client_state:
            load_into(pl_module, client_state["body"])

    @override
    def configure_eval_finetune(self, pl_module: FederatedModule) -> torch.optim.Optimizer | None:
        """``finetune: head``: the module's optimizer over the head's parameters alone; ``whole``: None (the
        module's optimizer over every trainable parameter)."""
        if self.finetune == "whole":
            return None
        head = {id(p) for n, p in pl_module.named_parameters() if n in parameter_names(pl_module, self.head_rule)}
        built = pl_module.configure_optimizers()
        optimizer = built["optimizer"] if isinstance(built, dict) else built
        for group in optimizer.param_groups:  # a fresh optimizer: no state to drop with the body's parameters
            group["params"] = [p for p in group["params"] if id(p) in head]
        return optimizer

    @override
    def global_model_state(self, client_id: str) -> dict:
        """The averaged body (with the client's initial head), evaluated beside the fine-tuned model."""
        return dict(self.global_state)
