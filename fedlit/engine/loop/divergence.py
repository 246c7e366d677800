"""Divergence: a run whose training loss grows by orders of magnitude while every value stays finite.

A learning rate far too high for the model (SCAFFOLD at lr 50, say) can blow the loss up round after round
(5.4e2, 1.1e6, 1.95e10...) without a NaN or an upload large enough for :mod:`fedlit.engine.loop.screening` to
reject: the run would end with accuracy at chance and exit 0. So after each round's turns the server compares the
round's mean training loss over the clients (``server/train/loss_mean``) with that of the run's first round: more
than :data:`FACTOR` times it is divergence. The first round is the reference because a healthy run's loss falls
from there; a loss that is not positive in the first round gives no reference (nothing is checked).

``federation.divergence`` says what happens: ``warn`` (the default) warns once per process and goes on; ``stop``
ends the run before the round is recorded or saved, its last good checkpoint kept; ``off`` checks nothing. The
reference is kept in the checkpoint, so a resumed run compares with the same first round.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

from fedlit.core.checkpoint_io import last_good_checkpoint
from fedlit.core.errors import FedlitError

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

#: How many times the first round's mean training loss a round's may reach before the run counts as diverging.
FACTOR = 100.0


def check(run: Run, server_round: int, loss: float | None) -> None:
    """Compare the round's mean training loss ``loss`` with the run's first round (see the module docstring).

    Raises:
        FedlitError: with ``federation.divergence: stop``, when the run diverges (its last checkpoint kept).
    """
    mode, state = run.settings.divergence, run.state.divergence
    if mode == "off" or loss is None or not math.isfinite(loss):
        return
    if "loss" not in state:
        state.update({"round": server_round, "loss": loss})
        return
    first, first_round = float(state["loss"]), int(state["round"])
    if first <= 0 or loss <= FACTOR * first:
        return
    message = (
        f"Round {server_round}: the clients' mean training loss {loss:.3g} is over {FACTOR:g} times that of round "
        f"{first_round} ({first:.3g}): the training diverges (a learning rate too high for the strategy?). Lower "
        "model.init_args.lr"
    )
    if mode == "stop":
        kept = last_good_checkpoint(run.out_dir, yet="")
        raise FedlitError(
            f"{message}, then start again or resume. federation.divergence=stop: the round is not recorded or "
            f"saved; {kept}."
        )
    if not state.get("warned"):
        state["warned"] = True
        warnings.warn(
            f"{message}. federation.divergence: stop ends such a run here (keeping its last good checkpoint); off "
            "checks nothing.",
            stacklevel=3,
        )
