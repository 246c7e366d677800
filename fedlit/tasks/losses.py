"""Asymmetric loss for multi-label classification.

Ridnik, Ben-Baruch, Zamir, Noy, Friedman, Protter, Zelnik-Manor. "Asymmetric Loss For Multi-Label
Classification." ICCV 2021. https://arxiv.org/abs/2009.14119

Per label, with ``p = sigmoid(z)`` the predicted probability of the label and ``y`` its target (Eq. 1, 4, 5):

    (4)  p_m = max(p - m, 0)                                 (probability shifting of the negatives, margin m)
    (5)  L+ = (1 - p)^gamma_pos * log(p)                      (a positive label)
         L- = p_m^gamma_neg * log(1 - p_m)                    (a negative label)
         ASL = -(y L+ + (1 - y) L-)

Logarithms are of the probability clamped to at least ``eps`` (the authors' code does the same), and gradients
flow through the focusing weights as in the authors' ``AsymmetricLoss``. With ``gamma_neg = gamma_pos = 0`` and
``m = 0`` it is binary cross-entropy.

Symbols -> code: ``m`` -> ``clip``; ``gamma_pos``, ``gamma_neg`` -> same names; ``1 - p_m`` -> ``negative``.

Deviation (reduction): the authors' code returns the sum over the labels and the samples of a batch; here the sum
over labels is averaged over the samples, so the loss does not grow with the batch size and a learning rate tuned
for one batch size keeps its meaning for another (the gradient is the authors' divided by the batch size).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

__all__ = ["ASL_DEFAULTS", "asymmetric_loss", "check_asymmetric_options"]

#: The paper's values (Sec. 4, and the authors' defaults): gamma_neg 4, gamma_pos 1, margin 0.05, eps 1e-8.
ASL_DEFAULTS: dict[str, float] = {"gamma_neg": 4.0, "gamma_pos": 1.0, "clip": 0.05, "eps": 1e-8}


def check_asymmetric_options(options: Any) -> list[str]:
    """The problems of an asymmetric ``loss_options`` mapping, as messages naming each key (empty: none)."""
    if options is None:
        return []
    if not isinstance(options, dict):
        return [f"loss_options must be a mapping of {sorted(ASL_DEFAULTS)}, got {options!r}"]
    problems = []
    unknown = sorted(set(options) - set(ASL_DEFAULTS))
    if unknown:
        problems.append(f"loss_options has unknown keys {unknown}; the asymmetric loss takes {sorted(ASL_DEFAULTS)}")
    for key in sorted(set(options) & set(ASL_DEFAULTS)):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"loss_options.{key} must be a finite number, got {value!r}")
        elif key in ("gamma_neg", "gamma_pos") and value < 0:
            problems.append(f"loss_options.{key} must be >= 0, got {value!r}")
        elif key == "clip" and not 0 <= value < 1:
            problems.append(f"loss_options.clip must be in [0, 1), got {value!r}")
        elif key == "eps" and not 0 < value < 1:
            problems.append(f"loss_options.eps must be in (0, 1), got {value!r}")
    return problems


def asymmetric_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    gamma_neg: float = 4.0,
    gamma_pos: float = 1.0,
    clip: float = 0.05,
    eps: float = 1e-8,
) -> Tensor:
    """The asymmetric loss (module docstring): summed over the labels, averaged over the samples.

    Args:
        logits: (N, L) or (N,) logits (one label per column).
        targets: 0/1 targets of the same number of elements (reshaped to ``logits``).
        gamma_neg: Focusing exponent of the negative labels.
        gamma_pos: Focusing exponent of the positive labels.
        clip: Probability margin ``m`` of the negatives (0: none).
        eps: Lower clamp of the probabilities inside the logarithms.

    Returns:
        A scalar tensor.
    """
    y = targets.reshape(logits.shape).to(logits.dtype)
    p = logits.sigmoid()
    negative = (1 - p + clip).clamp(max=1) if clip > 0 else 1 - p  # 1 - p_m
    log_pos = p.clamp(min=eps).log() * (1 - p).pow(gamma_pos)
    log_neg = negative.clamp(min=eps).log() * (1 - negative).pow(gamma_neg)
    per_label = -(y * log_pos + (1 - y) * log_neg)
    per_sample = per_label.reshape(len(per_label), -1).sum(dim=1)
    return per_sample.mean()
