"""Metric math that layers below the tasks need too: pure tensor functions, no module, no state.

A task evaluates with these; a data set may describe itself with them (``SyntheticSurvival`` records, per site,
the C-index of its known true risk: the ceiling a model can reach), and a data set must not import a task, so
the math lives here, below both.

- :func:`concordance_index`: Harrell's concordance index (Harrell, F. E., Califf, R. M., Pryor, D. B., Lee, K. L.,
  Rosati, R. A. "Evaluating the Yield of Medical Tests." JAMA, 1982), the share of comparable pairs that the risk
  scores order correctly. A pair (i, j) is comparable when i had an event before j's time (t_i < t_j), or at j's
  time when j is censored then (j was known to be event-free at t_i, as scikit-survival's
  ``concordance_index_censored`` counts it); it is concordant when r_i > r_j, and tied scores count one half. Two
  events at the same time are not comparable. 0.5 is chance, 1 a perfect ordering.
"""

from __future__ import annotations

from torch import Tensor


def concordance_index(risk: Tensor, time: Tensor, event: Tensor, *, block: int = 1024) -> float:
    """Harrell's C-index of ``risk`` (higher = earlier event); NaN when no pair is comparable.

    Args:
        risk: (N,) risk scores.
        time: (N,) event or censoring times.
        event: (N,) 1 for an event, 0 for censoring.
        block: rows compared at once (memory is ``block * N``).
    """
    risk, time = risk.reshape(-1).double(), time.reshape(-1).double()
    event = event.reshape(-1) > 0.5
    concordant, comparable = 0.0, 0
    for start in range(0, len(risk), block):
        rows = slice(start, start + block)
        r_i, t_i, e_i = risk[rows, None], time[rows, None], event[rows, None]
        # i had its event first: strictly before j's time, or at j's time when j was censored then
        pairs = e_i & ((t_i < time[None]) | ((t_i == time[None]) & ~event[None]))
        comparable += int(pairs.sum())
        concordant += float((pairs & (r_i > risk[None])).sum()) + 0.5 * float((pairs & (r_i == risk[None])).sum())
    return concordant / comparable if comparable else float("nan")
