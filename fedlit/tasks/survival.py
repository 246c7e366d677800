"""Survival analysis: a Cox proportional-hazards model over a backbone's features, judged by Harrell's C-index.

Cox, D. R. "Regression Models and Life-Tables." Journal of the Royal Statistical Society, Series B, 1972. The
model's output is a risk score r(x) = f(x) (the log hazard ratio): the hazard of a sample is
h(t | x) = h_0(t) exp(r(x)) with an unspecified baseline h_0. It is fitted by maximizing the partial likelihood

    (1)  PL = prod_{i: event} exp(r_i) / sum_{j: t_j >= t_i} exp(r_j),

with tied event times handled as Breslow proposed (Breslow, N. "Covariance Analysis of Censored Survival
Data." Biometrics, 1974): each event of a tie keeps the full risk set {j : t_j >= t_i}, tied events included.
The loss is the negative log of (1), computed on a mini-batch during training (the risk sets are those within
the batch, as deep Cox models do) and on the whole split for the ``loss`` metric, divided by either

- the number of events (``events``, the default): the mean over the terms of (1), as DeepSurv (Katzman, J. L.
  et al. "DeepSurv: Personalized Treatment Recommender System Using a Cox Proportional Hazards Deep Neural
  Network." BMC Medical Research Methodology, 2018) and pycox define it. torchsurv's ``reduction="mean"`` is the
  same without tied event times (with ties it averages over the distinct event times instead);
- or the number of samples (``samples``), censored ones included: the Cox loss of FLamby's Fed-TCGA-BRCA
  baseline (Ogier du Terrail, J. et al. "FLamby: Datasets and Benchmarks for Cross-Silo Federated Learning in
  Realistic Healthcare Settings." NeurIPS Datasets and Benchmarks, 2022), which averages a per-sample term that
  is 0 for a censored sample (its risk sets at tied times follow the order of a sort, where here they are
  Breslow's: the same without ties). lifelines' ``CoxPHFitter`` maximizes the sum of (1) by Newton's method
  (which the scale does not change) and multiplies its penalizer by the sample count: the same as penalizing
  this mean.

The two differ by the factor samples / events of the batch (about 1 / (1 - censoring share)): with 85% of the
samples censored, ``samples`` makes the loss, its gradients and so SGD's steps about 7 times smaller (Adam's
much less: it divides by the gradients' running scale), and within an epoch a batch with fewer events weighs
less. Choose ``samples`` to reuse a learning rate tuned with FLamby's loss, ``events`` otherwise.

Harrell's concordance index (Harrell, F. E., Califf, R. M., Pryor, D. B., Lee, K. L., Rosati, R. A.
"Evaluating the Yield of Medical Tests." JAMA, 1982) is the share of comparable pairs that the risk scores
order correctly: a pair (i, j) is comparable when i had an event before j's time (t_i < t_j), or at j's time
when j is censored then (j was known to be event-free at t_i, as scikit-survival's ``concordance_index_censored``
counts it); it is concordant when r_i > r_j, and tied scores count one half. Two events at the same time are
not comparable. 0.5 is chance, 1 a perfect ordering.
The C-index's math is :func:`fedlit.core.metrics.concordance_index` (importable from here as before): the
survival data set uses it too, and data sets sit below the tasks.

Targets are float (N, 2) rows (time, event): time >= 0, event 1 (the event happened at ``time``) or 0
(censored: event-free until ``time``, unknown after).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.core.metrics import concordance_index
from fedlit.core.roles import RoleRule
from fedlit.models import Backbone
from fedlit.module import FederatedModule


def cox_loss(
    risk: Tensor, time: Tensor, event: Tensor, normalization: Literal["events", "samples"] = "events"
) -> Tensor:
    """Negative Cox partial log-likelihood (Breslow ties), divided by the number of events or of samples.

    Args:
        risk: (N,) risk scores (log hazard ratios).
        time: (N,) event or censoring times.
        event: (N,) 1 where the event happened at ``time``, 0 where the sample is censored.
        normalization: ``events`` divides the sum by the number of events, ``samples`` by N (FLamby's
            Fed-TCGA-BRCA loss; see the module's docstring).

    Returns:
        A scalar. Without any event the partial likelihood is empty: 0, connected to ``risk`` (zero gradient).
    """
    if normalization not in ("events", "samples"):
        raise ValueError(f"cox_loss: normalization must be 'events' or 'samples', got {normalization!r}")
    risk = risk.reshape(-1).float()
    time, event = time.reshape(-1).float().contiguous(), event.reshape(-1) > 0.5
    if not bool(event.any()):
        return risk.sum() * 0.0
    # Sorted by decreasing time, the risk set of i ({j : t_j >= t_i}, ties included) is the first n_i samples,
    # n_i = the number of times >= t_i: log sum_{j at risk} exp(r_j) is a cumulative logsumexp read at n_i - 1.
    log_cumulative = torch.logcumsumexp(risk[torch.argsort(time, descending=True)], dim=0)
    at_risk = len(time) - torch.searchsorted(torch.sort(time).values, time, right=False)
    log_denominator = log_cumulative[at_risk - 1]
    return -(risk - log_denominator)[event].sum() / (len(time) if normalization == "samples" else event.sum())


class CoxModule(FederatedModule):
    """A backbone (frozen by default) with a linear risk head, trained with the Cox partial likelihood.

    Parameter names: ``backbone.*`` and ``head.weight`` (a Linear(num_features, 1) without bias: (1) does not
    change when every risk moves by the same constant, so a bias would never train). Default roles: the
    backbone is frozen, the head shared; with ``fedlit.models.Identity`` the model is a linear Cox model.
    Metrics per client and split: ``c_index`` (Harrell's) and ``loss`` (the Cox loss over the whole split, NaN
    when the split has no event).

    Args:
        backbone: What to build the feature extractor from (a :class:`~fedlit.models.Backbone` spec).
        roles: Role rules applied after the defaults.
        optimizer: Local optimizer.
        lr: Local learning rate.
        momentum: SGD momentum.
        weight_decay: Weight decay.
        loss_normalization: What the Cox loss is divided by, in training and in the ``loss`` metric: ``events``
            (the number of events in the batch, DeepSurv's and pycox's mean) or ``samples`` (the batch size,
            censored samples included: FLamby's Fed-TCGA-BRCA baseline loss, to reproduce its learning rates).
            With heavy censoring ``samples`` gives SGD much smaller steps (see the module's docstring).
    """

    accepted_tasks = frozenset({"survival"})
    default_selection_metric = "c_index"
    feature_extractor = "backbone"
    task = "survival"

    def __init__(
        self,
        *,
        backbone: Backbone,
        roles: list[RoleRule] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        loss_normalization: Literal["events", "samples"] = "events",
    ) -> None:
        super().__init__(roles=roles, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
        if loss_normalization not in ("events", "samples"):
            raise ConfigError(
                f"model.init_args.loss_normalization must be 'events' or 'samples', got {loss_normalization!r}"
            )
        self.loss_normalization = loss_normalization
        self.backbone = backbone.build()
        self.head = nn.Linear(cast(int, self.backbone.num_features), 1, bias=False)  # Backbone.build's contract
        self._risks: list[Tensor] = []
        self._targets: list[Tensor] = []

    @override
    def default_role_rules(self) -> list[RoleRule]:
        """The backbone frozen (when it has tensors: ``Identity`` has none, and a rule for it would be reported
        as matching nothing) and the head shared."""
        frozen = [RoleRule("backbone.*", "frozen")] if self.backbone.state_dict() else []
        return [*frozen, RoleRule("head.*", "shared")]

    @override
    def forward(self, inputs: Any) -> Tensor:
        """(B,) risk scores."""
        return self.head(self.extract_features(inputs)).reshape(-1)

    @override
    def training_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``{"loss", "risk", "targets"}``: the Cox loss over the batch's risk sets."""
        inputs, targets = batch
        risk = self(inputs)
        loss = cox_loss(risk, targets[:, 0], targets[:, 1], self.loss_normalization)
        return {"loss": loss, "risk": risk, "targets": targets}

    @override
    def validation_step(self, batch: tuple[Any, Tensor], batch_idx: int) -> Tensor:
        """Keep the batch's risks and targets: both metrics need the whole split's risk sets and pairs."""
        inputs, targets = batch
        risk = self(inputs)
        self._risks.append(risk.detach().float().cpu())
        self._targets.append(targets.detach().float().cpu())
        return cox_loss(risk, targets[:, 0], targets[:, 1], self.loss_normalization)

    @override
    def reset_metrics(self) -> None:
        self._risks, self._targets = [], []

    @override
    def compute_metrics(self) -> dict[str, float]:
        """``c_index`` and ``loss`` over every sample since the last reset."""
        if not self._risks:
            return {}
        return self._metrics(torch.cat(self._risks), torch.cat(self._targets))

    @override
    def pooled_predictions(self) -> dict[str, Tensor] | None:
        """The split's risk scores and (time, event) targets since the last reset (CPU tensors)."""
        if not self._risks:
            return None
        return {"risk": torch.cat(self._risks), "targets": torch.cat(self._targets)}

    @override
    def pooled_metrics(self, predictions: list[Any]) -> dict[str, float]:
        """``c_index`` and ``loss`` over the clients' samples together: the C-index's pairs and the Cox loss's risk
        sets span the clients (FLamby's pooled C-index on Fed-TCGA-BRCA)."""
        if not predictions:
            return {}
        risk = torch.cat([p["risk"] for p in predictions])
        return self._metrics(risk, torch.cat([p["targets"] for p in predictions]))

    def _metrics(self, risk: Tensor, targets: Tensor) -> dict[str, float]:
        time, event = targets[:, 0], targets[:, 1]
        has_events = bool((event > 0.5).any())
        loss = float(cox_loss(risk, time, event, self.loss_normalization)) if has_events else float("nan")
        return {"c_index": concordance_index(risk, time, event), "loss": loss}

    @override
    @property
    def higher_is_better(self) -> dict[str, bool]:
        return {"c_index": True, "loss": False}
