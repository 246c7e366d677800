"""How sure ``fedlit report`` is of a gain: a Student t-interval over seeds and the verdict it allows.

With k seeds the mean gain over the baseline has standard error s / sqrt(k) (s the sample standard deviation over
seeds), and its 95 % interval is mean +- t_{0.975, k-1} * s / sqrt(k): Student's t with k - 1 degrees of freedom, not
the normal 1.96, because s itself is estimated from k values (t_{0.975, 2} = 4.303 at 3 seeds, 2.776 at 5, 2.262 at
10). A method **beats** the baseline only when the whole interval is above zero and **loses to** it only when the
whole interval is below; otherwise the two are *not separated at k seeds* (which is not "equal": more seeds may
separate them). One seed has no standard deviation, so no interval and no verdict. The gain is signed so that
positive is better (see :func:`fedlit.commands.report.runs.summary`), whichever way the metric is ranked.

Nothing here reads runs or draws; :mod:`fedlit.commands.report.figures` prints these in the report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LEVEL", "Interval", "gain_sentence", "shown", "t_interval", "t_quantile", "verdict"]

#: The two-sided coverage of the report's intervals.
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``k`` seeds with its standard error and its two-sided t-interval (``low``, ``high``); the
    standard error and the bounds are NaN for one seed."""

    mean: float
    se: float
    k: int
    low: float
    high: float


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom: t_{(1 + level) / 2, df}
    (``scipy.stats.t.ppf``; 4.302653 for df 2 at 95 %)."""
    from scipy.stats import t  # imported here: only the report needs it, and not at start-up

    return float(t.ppf((1 + level) / 2, df))


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval | None:
    """The mean of the finite ``values`` (one per seed) and its t-interval with k - 1 degrees of freedom: mean +-
    t_{(1 + level) / 2, k-1} * s / sqrt(k). None without a finite value; bounds NaN for one."""
    finite = [v for v in values if not math.isnan(v)]
    k = len(finite)
    if not k:
        return None
    mean = sum(finite) / k
    if k == 1:
        return Interval(mean, math.nan, 1, math.nan, math.nan)
    se = math.sqrt(sum((v - mean) ** 2 for v in finite) / (k - 1)) / math.sqrt(k)
    half = t_quantile(k - 1, level) * se
    return Interval(mean, se, k, mean - half, mean + half)


def verdict(interval: Interval | None, baseline: str = "Local") -> str:
    """``beats <baseline>`` when the interval of the gain is above zero, ``loses to <baseline>`` when below,
    ``not separated at k seeds`` when it holds zero, ``one seed: no interval``, or ``—`` without a gain."""
    if interval is None:
        return "—"
    if interval.k == 1:
        return "one seed: no interval"
    if interval.low > 0:
        return f"beats {baseline}"
    if interval.high < 0:
        return f"loses to {baseline}"
    return f"not separated at {interval.k} seeds"


def shown(interval: Interval | None) -> str:
    """The bounds as the report prints them, ``-0.0484 to 0.4484`` (``—`` without an interval)."""
    if interval is None or math.isnan(interval.low):
        return "—"
    return f"{interval.low:.4f} to {interval.high:.4f}"


def gain_sentence(interval: Interval | None, baseline: str = "Local", level: float = LEVEL) -> str:
    """``gain over Local: +0.2000 (95 % t-interval -0.0484 to 0.4484, 3 seeds): not separated at 3 seeds``; with one
    seed ``gain over Local: +0.3000 (1 seed): one seed: no interval``."""
    if interval is None:
        return f"gain over {baseline}: — (no seed paired)"
    seeds = f"{interval.k} seed{'' if interval.k == 1 else 's'}"
    bounds = "" if interval.k == 1 else f"{round(100 * level)} % t-interval {shown(interval)}, "
    return f"gain over {baseline}: {interval.mean:+.4f} ({bounds}{seeds}): {verdict(interval, baseline)}"
