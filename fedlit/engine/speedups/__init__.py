"""The speed-ups: the same results as the plain loop in less time, plugged in through the loop's
:class:`~fedlit.engine.loop.run.Speedup` seam (a run built by :class:`fedlit.federation.Federation` gets
:data:`BUILT_IN`).

- :mod:`~fedlit.engine.speedups.features`: a frozen feature extractor's outputs computed once per sample
  (``federation.cache_features``).
- :mod:`~fedlit.engine.speedups.fused`, :mod:`~fedlit.engine.speedups.fused_model`,
  :mod:`~fedlit.engine.speedups.fused_eval`: several clients trained and evaluated in one pass through the frozen
  backbone (``federation.fused_clients``).
- :mod:`~fedlit.engine.speedups.reuse`: a client's last evaluation given again while nothing it read changed
  (``federation.reuse_evaluations``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import override

from fedlit.engine.loop.run import Speedup
from fedlit.engine.speedups import features, reuse
from fedlit.engine.speedups.fused import FusedExecutor

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

__all__ = ["BUILT_IN", "CachedFeatures", "FusedClients", "ReusedEvaluations"]


class CachedFeatures(Speedup):
    """``federation.cache_features``: the clients' turns read features computed once (:mod:`.features`)."""

    @override
    def configure(self, run: Run) -> None:
        run.client_data = features.feature_data(run)


class FusedClients(Speedup):
    """``federation.fused_clients`` > 1: the :class:`~.fused.FusedExecutor`, unless an executor was given."""

    @override
    def configure(self, run: Run) -> None:
        if run.executor is None and run.settings.fused_clients > 1:
            run.executor = FusedExecutor(run.settings.fused_clients)


class ReusedEvaluations(Speedup):
    """``federation.reuse_evaluations``: unchanged clients keep their last metrics (:mod:`.reuse`)."""

    @override
    def attach(self, run: Run) -> None:
        if run.settings.reuse_evaluations and not reuse.reuse_problems(run):
            run.evaluation_reuse = reuse.EvaluationReuse()


#: The speed-ups every run built by the facade, the command line or a Flower node gets, in the order they set up.
BUILT_IN: tuple[Speedup, ...] = (CachedFeatures(), FusedClients(), ReusedEvaluations())
