"""The PhysioNet/CinC Challenge 2021 score as a torchmetrics ``Metric``.

Reyna et al., "Will Two Do? Varying Dimensions in Electrocardiography: The PhysioNet/Computing in Cardiology
Challenge 2021", CinC 2021; the definition of the challenge's scoring code (github.com/physionetchallenges/
evaluation-2021, ``compute_challenge_metric``). For records ``i`` with 0/1 labels ``l_i`` and 0/1 outputs ``o_i``
over the scored classes, the multilabel confusion matrix gives each record a total weight of one, spread over its
(label, output) pairs::

    A[j, k] = sum_i l_ij * o_ik / max(|l_i OR o_i|, 1)        (|l_i OR o_i|: classes labelled or output)
    s(o) = sum_jk W[j, k] * A[j, k]                           (W: the published weights, WEIGHTS)
    score = (s(outputs) - s(inactive)) / (s(labels) - s(inactive))

where ``inactive`` outputs the normal class (sinus rhythm) alone for every record and ``labels`` is the perfect
classifier; 0 when the two coincide. The outputs are the probabilities above ``threshold`` (0.5, as the FedPxN
authors' code thresholds them); logits (values outside [0, 1]) go through a sigmoid first, as torchmetrics does.
The three sums add over records, so the metric accumulates them over batches (and processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from typing_extensions import override

from fedlit.core.errors import ConfigError
from fedlit.data.cinc2021_labels import NORMAL_INDEX, WEIGHTS

__all__ = ["CinC2021Score", "challenge_sums", "cinc2021_metric"]


def challenge_sums(labels: Tensor, outputs: Tensor, weights: Tensor, normal_index: int) -> Tensor:
    """``(s(outputs), s(labels), s(inactive))`` of a batch (module docstring), float64 (3,).

    Args:
        labels: 0/1 (N, C).
        outputs: 0/1 (N, C).
        weights: (C, C) weight matrix, rows the labels and columns the outputs.
        normal_index: the class the inactive classifier outputs.
    """
    labels, outputs, weights = labels.double(), outputs.double(), weights.double().to(labels.device)
    inactive = torch.zeros_like(labels)
    inactive[:, normal_index] = 1.0

    def score(out: Tensor) -> Tensor:
        union = torch.clamp((torch.maximum(labels, out)).sum(dim=1), min=1.0)
        return (torch.einsum("ij,jk,ik->i", labels, weights, out) / union).sum()

    return torch.stack([score(outputs), score(labels), score(inactive)])


class CinC2021Score(Metric):
    """The challenge score (module docstring) of multilabel probabilities or logits (N, C) against 0/1 targets.

    Args:
        threshold: an output is positive when its probability is above it.
        weights: the (C, C) weight matrix (default: the challenge's, 26 classes).
        normal_index: the normal class (default: sinus rhythm in the challenge's order).
        kwargs: torchmetrics ``Metric`` options.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        threshold: float = 0.5,
        weights: Sequence[Sequence[float]] | None = None,
        normal_index: int = NORMAL_INDEX,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        matrix = torch.tensor(WEIGHTS if weights is None else weights, dtype=torch.float64)
        problems = []
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            problems.append(f"weights must be a square matrix, got shape {tuple(matrix.shape)}")
        elif not 0 <= normal_index < matrix.shape[0]:
            problems.append(f"normal_index must be in [0, {matrix.shape[0]}), got {normal_index}")
        if not 0 < threshold < 1:
            problems.append(f"threshold must be in (0, 1), got {threshold}")
        if problems:
            raise ConfigError("CinC2021Score: " + "; ".join(problems))
        self.threshold, self.normal_index = float(threshold), int(normal_index)
        self.weights: Tensor
        self.register_buffer("weights", matrix, persistent=False)
        self.sums: Tensor
        self.add_state("sums", default=torch.zeros(3, dtype=torch.float64), dist_reduce_fx="sum")

    @override
    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch: ``preds`` (N, C) probabilities or logits, ``target`` (N, C) 0/1."""
        if preds.shape != target.shape or preds.ndim != 2 or preds.shape[1] != self.weights.shape[0]:
            raise ValueError(
                f"CinC2021Score expects preds and target of shape (N, {self.weights.shape[0]}), got "
                f"{tuple(preds.shape)} and {tuple(target.shape)}"
            )
        preds = preds.detach().float()
        if preds.numel() and (preds.min() < 0 or preds.max() > 1):
            preds = preds.sigmoid()
        self.sums += challenge_sums(target > 0.5, preds > self.threshold, self.weights, self.normal_index)

    @override
    def compute(self) -> Tensor:
        """The normalized score; 0 when the perfect and the inactive classifiers score the same."""
        observed, correct, inactive = self.sums
        if correct == inactive:
            return torch.tensor(0.0, dtype=torch.float64, device=self.sums.device)
        return (observed - inactive) / (correct - inactive)


def cinc2021_metric(task: str, num_classes: int) -> Metric:
    """The factory the metric registry calls (``extra_metrics: [cinc2021]``): the challenge score of a multilabel
    task over the 26 scored classes.

    Raises:
        ConfigError: for another task or class count.
    """
    if task != "multilabel" or num_classes != len(WEIGHTS):
        raise ConfigError(
            f"extra_metrics: cinc2021 scores the multilabel task over the challenge's {len(WEIGHTS)} classes "
            f"(fedlit.data.CinC2021), got task {task!r} with {num_classes} classes"
        )
    return CinC2021Score()
