"""Callbacks of the federated loop: which Lightning callbacks it can run, and server-side early stopping.

The loop (:class:`~fedlit.federation.Federation`) is not Lightning's ``Trainer``: it calls the hooks in
:data:`LOOP_HOOKS` and no others. A Lightning callback written for the ``Trainer`` (``EarlyStopping``,
``ModelCheckpoint``, ``LearningRateMonitor``...) acts in hooks such as ``on_validation_end`` or
``on_train_end`` that never come, so it would do nothing, silently; :func:`check_callbacks` refuses it and says
what to use instead.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback, LightningModule
from typing_extensions import override

from fedlit.core.errors import ConfigError

#: The hooks the federated loop calls on callbacks (see docs/concepts.md, "The loop").
LOOP_HOOKS = frozenset({
    "on_fit_start", "on_round_start", "on_client_fit_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
    "on_train_batch_end", "on_train_epoch_end", "on_client_fit_end", "on_before_aggregate", "on_after_aggregate",
    "on_round_end",
    "on_fit_end", "on_client_evaluate_start",
})

# What to use instead of Lightning's Trainer-only callbacks (matched by class name along the MRO).
_INSTEAD = {
    "EarlyStopping": "fedlit.callbacks.EarlyStopping (patience counted in evaluated rounds on the mean "
                     "validation metric)",
    "ModelCheckpoint": "the loop's own checkpoints (checkpoints/last.ckpt every federation.checkpoint_every "
                       "rounds; the best round is reported from the evaluation history)",
    "LearningRateMonitor": "nothing: a round-interval schedule's rate is logged as server/train/lr (see "
                           "model.init_args.lr_scheduler)",
}


def trainer_only_hooks(callback: Any) -> list[str]:
    """The ``on_*`` hooks that ``callback``'s class implements and the loop never calls, sorted."""
    hooks = []
    for name in dir(type(callback)):
        if not name.startswith("on_") or name in LOOP_HOOKS:
            continue
        impl = getattr(type(callback), name, None)
        if callable(impl) and impl not in (getattr(Callback, name, None), getattr(LightningModule, name, None)):
            hooks.append(name)
    return sorted(hooks)


def check_callbacks(callbacks: list[Any]) -> None:
    """Refuse callbacks that rely on hooks the loop never calls (Lightning's Trainer-only callbacks).

    Raises:
        ConfigError: Naming each such callback (as ``callbacks[i]``), the hooks it relies on and what to use
            instead.
    """
    problems = []
    for i, callback in enumerate(callbacks):
        cls = type(callback)
        hooks = trainer_only_hooks(callback)
        known = next((_INSTEAD[c.__name__] for c in cls.__mro__
                      if c.__name__ in _INSTEAD and c.__module__.startswith(("lightning", "pytorch_lightning"))),
                     None)
        if not hooks and known is None:
            continue
        relies = f"relies on {', '.join(hooks)}" if hooks else "is written for Lightning's Trainer"
        instead = known or ("a callback that implements the loop's hooks instead: " + ", ".join(sorted(LOOP_HOOKS)))
        problems.append(f"callbacks[{i}]={cls.__module__}.{cls.__qualname__} {relies}, which the federated loop "
                        f"never calls (it would do nothing). Use {instead}")
    if problems:
        raise ConfigError("; ".join(problems) + ". See docs/concepts.md, 'The loop', for the hooks it calls.")


class EarlyStopping(Callback):
    """Stop the run when the mean validation metric has not improved for ``patience`` evaluated rounds.

    Called in ``on_round_end`` of every evaluated round (rounds without evaluation do not count). The metric is
    the mean over clients on validation (``server/val/<metric>_mean``), the one that picks the reported best
    round; its direction comes from the module (``higher_is_better``). A NaN value counts as no improvement. The
    round it stops at is evaluated, checkpointed and reported; ``results.json`` records it under
    ``stopped_early``. Its counters are saved in the checkpoint, so a resumed run goes on counting (and one that
    had stopped stays stopped, unless resumed with a larger ``patience``).

    Args:
        patience: Evaluated rounds without improvement before stopping (>= 1).
        min_delta: An improvement must exceed this (>= 0) to reset the count.
        metric: The metric (``accuracy``, ``auroc``, ``loss``...); None uses ``federation.selection_metric``.
    """

    def __init__(self, *, patience: int = 5, min_delta: float = 0.0, metric: str | None = None) -> None:
        problems = []
        if not isinstance(patience, int) or patience < 1:
            problems.append(f"patience={patience!r} must be an integer >= 1")
        if not min_delta >= 0:
            problems.append(f"min_delta={min_delta!r} must be >= 0")
        if problems:
            raise ConfigError("EarlyStopping: " + "; ".join(problems) + ".")
        self.patience, self.min_delta, self.metric = patience, float(min_delta), metric
        self.best: float | None = None
        self.best_round: int | None = None
        self.wait = 0

    def __repr__(self) -> str:
        return f"EarlyStopping(patience={self.patience}, min_delta={self.min_delta}, metric={self.metric!r})"

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        metric = self._metric(trainer)
        known = getattr(pl_module, "higher_is_better", {})
        if known and metric not in known:
            raise ConfigError(f"EarlyStopping: metric={metric!r} is not one of {sorted(known)}.")
        if not any(trainer.num_examples(c, "val") for c in trainer.client_ids):
            raise ConfigError("EarlyStopping watches the mean validation metric, but no client has a validation "
                              "split. Give the clients one (data.init_args) or remove the callback.")
        if self.wait >= self.patience:  # restored from a run that had stopped
            self._stop(trainer, metric)

    def on_round_end(self, trainer: Any, pl_module: Any, server_round: int, metrics: dict[str, float]) -> None:
        """Count this round if it was evaluated; stop the run after ``patience`` rounds without improvement."""
        if not metrics:
            return
        metric = self._metric(trainer)
        key = f"server/val/{metric}_mean"
        if key not in metrics:
            raise ConfigError(f"EarlyStopping: round {server_round} has no {key} to watch (the data has no "
                              "validation split, or no client has a value). Give the clients a validation split "
                              "or remove the callback.")
        value = float(metrics[key])
        higher = pl_module.higher_is_better.get(metric, True)
        improved = math.isfinite(value) and (
            self.best is None or (value - self.best if higher else self.best - value) > self.min_delta)
        if improved:
            self.best, self.best_round, self.wait = value, server_round, 0
        else:
            self.wait += 1
        if self.wait >= self.patience:
            self._stop(trainer, metric)

    def _metric(self, trainer: Any) -> str:
        return self.metric or trainer.history.selection_metric

    def _stop(self, trainer: Any, metric: str) -> None:
        best = "none finite" if self.best is None else f"best {self.best:.6g} at round {self.best_round}"
        trainer.should_stop = True
        trainer.stop_reason = (f"EarlyStopping: mean validation {metric} did not improve by more than "
                               f"{self.min_delta:g} for {self.wait} evaluated rounds ({best})")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_round": self.best_round, "wait": self.wait}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_round, self.wait = state_dict["best"], state_dict["best_round"], state_dict["wait"]
