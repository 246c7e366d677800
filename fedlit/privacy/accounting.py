"""What the privacy callbacks share: Opacus's Rényi-DP accountant, the settings check, the resume warning."""

from __future__ import annotations

import math
import warnings
from typing import Any

from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError

ACCOUNTANT = "opacus.accountants.RDPAccountant"
INSTALL = "pip install 'fedlit[privacy]' (or pip install opacus)"


def rdp_accountant(history: list[Any] | None = None) -> Any:
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as err:  # an optional dependency: say how to get it
        raise ConfigError(f"The privacy callbacks need Opacus: {INSTALL}.") from err
    accountant = RDPAccountant()
    accountant.history = [tuple(h) for h in history or []]
    return accountant


def check_settings(owner: str, noise_multiplier: float, clip: tuple[str, float], delta: float) -> None:
    problems = []
    if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) and noise_multiplier > 0):
        problems.append(
            f"noise_multiplier={noise_multiplier!r} must be a finite number > 0 (the noise std in units "
            f"of the clipping norm; 0 would give no privacy and an infinite epsilon)"
        )
    name, value = clip
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        problems.append(f"{name}={value!r} must be a finite number > 0")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(
            f"delta={delta!r} must be in (0, 1) (typically below 1 / the number of "
            f"{'clients' if owner == 'ClientLevelDP' else 'training samples'})"
        )
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems) + ".")


def warn_uncovered(owner: str, covered: int, trainer: ServerContext) -> None:
    """Warn when a resumed run has rounds that ran without the callback: its epsilon does not cover them."""
    if getattr(trainer, "server_round", 0) > covered:
        warnings.warn(
            f"{owner}: the checkpoint's rounds {covered + 1}..{trainer.server_round} ran without it, so "
            "the epsilon it reports covers only the rounds it sees (those rounds had no privacy "
            "guarantee).",
            stacklevel=3,
        )
