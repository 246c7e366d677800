"""Deprecated: the math that lived here moved. The generic aggregation math is in
:mod:`fedlit.strategies.common.aggregate`
and each algorithm's own math in that algorithm's file (``fedlit.strategies.scaffold.scaffold_control_variate``,
``fedlit.strategies.apple.apple_mix``...); byte counts of nested tensors are :func:`fedlit.core.tensors.nbytes`.

``fedlit.strategies.functional.<name>`` still finds each old name (with a ``DeprecationWarning`` naming its new
home) so that code written against it keeps working; import from the new module instead.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: The module that holds each old name now (names separated by spaces).
_HOMES: dict[str, str] = {
    "fedlit.strategies.common.aggregate": (
        "coordinate_median krum_scores krum_select normalized_weights "
        "pairwise_squared_distances trimmed_mean weighted_average"
    ),
    "fedlit.strategies.apple": "apple_download_choice apple_mix apple_proximal apple_proximal_coefficient",
    "fedlit.strategies.epfl": "epfl_weights mean_tensor_distances",
    "fedlit.strategies.feddyn": "feddyn_penalty feddyn_server_update",
    "fedlit.strategies.fedheal": "heal_aggregate heal_consistency_mask heal_weights",
    "fedlit.strategies.fedmetamed.equations": (
        "cumulative_fourier_average distillation_kl fourier_matrix fourier_ratio fourier_unmatrix prr_losses prr_stage"
    ),
    "fedlit.strategies.fedprox": "squared_distance",
    "fedlit.strategies.fedra": "partial_weighted_average random_allocation",
    "fedlit.strategies.fedsca": "cosine_regularizer flat_distances sgca_weights simplex_projection",
    "fedlit.strategies.fedsld": "class_prior sld_loss sld_weights",
    "fedlit.strategies.pgfed": (
        "momentum_mix pgfed_auxiliary_gradient pgfed_coefficient_step pgfed_risk_offset state_dot"
    ),
    "fedlit.strategies.scaffold": "scaffold_control_variate scaffold_server_control server_step",
}
#: Each old name -> ``module`` or ``module:new_name``.
MOVED: dict[str, str] = {name: module for module, names in _HOMES.items() for name in names.split()}
MOVED.update({"state_nbytes": "fedlit.core.tensors:nbytes", "state_numel": "fedlit.core.tensors:numel"})


def __getattr__(name: str) -> Any:
    target = MOVED.get(name)
    if target is None:
        raise AttributeError(f"module 'fedlit.strategies.functional' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    warnings.warn(
        f"fedlit.strategies.functional.{name} moved to {module}.{attr or name}; import it from there.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), attr or name)
