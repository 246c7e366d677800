"""Callbacks of the federated loop: which Lightning callbacks it can run, and server-side early stopping.

The loop (:class:`~fedlit.federation.Federation`) is not Lightning's ``Trainer``: it calls the hooks in
:data:`LOOP_HOOKS` and no others. A Lightning callback written for the ``Trainer`` (``EarlyStopping``,
``ModelCheckpoint``, ``LearningRateMonitor``...) acts in hooks such as ``on_validation_end`` or
``on_train_end`` that never come, so it would do nothing, silently; :func:`check_callbacks` refuses it and says
what to use instead. One whose hooks share the loop's names (``ModelSummary``'s ``on_fit_start``) would get the loop's
contexts instead of a Trainer: refused too. :func:`accepted` says which classes can act in the loop.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from lightning.pytorch import Callback, LightningModule
from typing_extensions import override

from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.module import FederatedModule

#: The hooks the federated loop calls on the strategy and the callbacks (``hooks.call("...")`` in
#: :mod:`fedlit.engine` and :mod:`fedlit.flower`; see docs/concepts.md, "The loop"). The one list of them.
LOOP_HOOKS = frozenset(
    {
        "on_fit_start",
        "on_round_start",
        "on_client_fit_start",
        "on_train_epoch_start",
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_client_fit_end",
        "on_before_aggregate",
        "on_after_aggregate",
        "on_round_end",
        "on_fit_end",
        "on_client_evaluate_start",
    }
)

#: The Strategy API's methods named like hooks, which the loop calls on the strategy directly.
STRATEGY_HOOKS = frozenset(
    {
        "configure_roles",
        "configure_client",
        "configure_client_extras",
        "configure_evaluate",
        "configure_eval_finetune",
    }
)

#: The LightningModule methods named like hooks that fedlit's loop calls on the module (it calls no ``on_*`` one:
#: hooks go to the strategy and the callbacks).
MODULE_HOOKS = frozenset({"configure_optimizers"})

#: Names that look like hooks (checked on the strategy, the callbacks and the module).
HOOK_PREFIXES = ("on_", "configure_")

# What to use instead of Lightning's Trainer-only callbacks (matched by class name along the MRO).
_INSTEAD = {
    "EarlyStopping": "fedlit.callbacks.EarlyStopping (patience counted in evaluated rounds on the mean "
    "validation metric)",
    "ModelCheckpoint": "the loop's own checkpoints (checkpoints/last.ckpt every federation.checkpoint_every "
    "rounds; the best round is reported from the evaluation history)",
    "LearningRateMonitor": "nothing: a round-interval schedule's rate is logged as server/train/lr (see "
    "model.init_args.lr_scheduler)",
}

# The loop's equivalent of Lightning hooks it does not call, where there is an obvious one: (hook, why).
_EVALUATION = ("on_round_end", "whose metrics hold the round's evaluation")
_TEST = ("on_fit_end", "the final test results go to results.json")
_HOOK_INSTEAD = {
    "on_train_start": ("on_fit_start", ""),
    "on_train_end": ("on_fit_end", ""),
    "on_validation_start": _EVALUATION,
    "on_validation_end": _EVALUATION,
    "on_validation_epoch_start": _EVALUATION,
    "on_validation_epoch_end": _EVALUATION,
    "on_test_end": _TEST,
    "on_test_epoch_end": _TEST,
    "on_save_checkpoint": ("state_dict", "checkpointed with the run"),
    "on_load_checkpoint": ("load_state_dict", "called on resume"),
    "configure_gradient_clipping": ("on_before_optimizer_step", "where the gradients are unscaled: clip them there"),
    "configure_callbacks": ("the federation's callbacks", "callbacks: in a recipe"),
}

# Words of misspelt hooks that mean another word of the loop's hooks.
_SYNONYMS = {
    "begin": "start",
    "starts": "start",
    "started": "start",
    "finish": "end",
    "ends": "end",
    "ended": "end",
    "stop": "end",
    "pre": "before",
    "post": "after",
}

# Classes whose methods are Lightning's own defaults, never the user's: not checked.
_LIGHTNING_BASES = frozenset({*Callback.__mro__, *LightningModule.__mro__})


def _defined_hooks(obj: Any) -> list[str]:
    """The methods of ``obj``'s class named like hooks (:data:`HOOK_PREFIXES`) that the class or a base other than
    Lightning's own base classes defines, sorted."""
    return _class_hooks(type(obj))


def _class_hooks(owner: type) -> list[str]:
    names: set[str] = set()
    for cls in owner.__mro__:
        if cls not in _LIGHTNING_BASES:
            names |= {
                n
                for n, v in vars(cls).items()
                if n.startswith(HOOK_PREFIXES) and (callable(v) or isinstance(v, staticmethod | classmethod))
            }
    return sorted(names)


def _is_lightning_hook(name: str) -> bool:
    return hasattr(Callback, name) or hasattr(LightningModule, name)


def _instead(hook: str, on_module: bool = False) -> str:
    """The loop's equivalent of Lightning's ``hook``, or the list of the loop's hooks."""
    if on_module and hook in LOOP_HOOKS:
        return f"a callback's {hook} (the loop calls its hooks on the strategy and the callbacks, not the module)"
    if hook not in _HOOK_INSTEAD:
        where = " on a callback" if on_module else ""
        return f"one of the loop's hooks{where}: " + ", ".join(sorted(LOOP_HOOKS))
    name, why = _HOOK_INSTEAD[hook]
    return ("a callback's " if on_module and name.startswith("on_") else "") + name + (f", {why}" if why else "")


def accepted(cls: type) -> bool:
    """Whether a callback of class ``cls`` can act in the loop (what ``fedlit fit --help`` lists under
    ``--callbacks``): it implements only the loop's hooks and is none of Lightning's own callbacks, which are
    written for its Trainer (:func:`check_callbacks` refuses those that implement hooks; the others do nothing)."""
    return not _lightning_class(cls) and all(h in LOOP_HOOKS for h in _class_hooks(cls))


def _lightning_class(cls: type) -> bool:
    """Whether ``cls`` is (or derives from) one of Lightning's callbacks, not its base classes."""
    return any(
        c not in _LIGHTNING_BASES and c.__module__.startswith(("lightning.", "pytorch_lightning.")) for c in cls.__mro__
    )


def _trainer_callback(cls: type) -> str | None:
    """What to use instead of ``cls`` when it is (or derives from) one of Lightning's Trainer-only callbacks."""
    return next(
        (_INSTEAD[c.__name__] for c in cls.__mro__ if c.__name__ in _INSTEAD and _lightning_class(c)),
        None,
    )


def trainer_only_hooks(callback: Any) -> list[str]:
    """The hooks that ``callback``'s class implements and the loop never calls on a callback, sorted: Lightning's
    (``on_validation_end``...) and misspelt ones (``on_client_fitstart``)."""
    return [n for n in _defined_hooks(callback) if n not in LOOP_HOOKS]


def _misspelt(label: str, hook: str, allowed: frozenset[str], on_module: bool = False) -> str:
    candidates = allowed | LOOP_HOOKS if on_module else allowed
    words = "_".join(_SYNONYMS.get(w, w) for w in hook.split("_"))  # on_client_fit_begin: _start, not _end
    close = difflib.get_close_matches(words, sorted(candidates), n=1, cutoff=0.6)
    if hook in STRATEGY_HOOKS:
        fix = "it is a method of the Strategy API, which the loop calls on the strategy only"
    elif not close:
        fix = "the names it calls are " + ", ".join(sorted(allowed))
    elif close[0] in allowed:
        fix = f"did you mean {close[0]}?"
    else:
        fix = f"did you mean {close[0]}? (on a callback: the loop calls no hook on the module)"
    return f"{label} defines {hook}, which is not a hook the federated loop calls (it would never be called): {fix}"


def _hook_problems(label: str, obj: Any, allowed: frozenset[str], on_module: bool = False) -> list[str]:
    """Problems of the strategy's or the module's hook names (see :func:`check_callbacks`)."""
    label = f"{label}={type(obj).__module__}.{type(obj).__qualname__}"
    problems = []
    for hook in (h for h in _defined_hooks(obj) if h not in allowed):
        if _is_lightning_hook(hook):
            problems.append(
                f"{label} defines {hook}, a Lightning hook that fedlit's loop does not call"
                f"{' on the module' if on_module else ''} (it would do nothing). Use "
                f"{_instead(hook, on_module)} instead"
            )
        else:
            problems.append(_misspelt(label, hook, allowed, on_module))
    return problems


def check_callbacks(callbacks: list[Any], *, strategy: Any = None, module: Any = None) -> None:
    """Refuse hooks that would never be called: on the strategy, the callbacks and the module, every method named
    like a hook (``on_*``, ``configure_*``) that their class defines (not Lightning's base classes) and that the
    loop does not call on it. A Lightning hook (``on_validation_end``, ``on_train_start``: Lightning's
    Trainer-only callbacks) is named with what to use instead; another name (a misspelt hook,
    ``on_client_fitstart``) with the closest real one.

    The names the loop calls: on the strategy :data:`LOOP_HOOKS` and :data:`STRATEGY_HOOKS`, on a callback
    :data:`LOOP_HOOKS`, on the module :data:`MODULE_HOOKS`.

    Args:
        callbacks: The extra callbacks (named ``callbacks[i]``).
        strategy: The strategy (named ``strategy``); None: not checked.
        module: The module (named ``model``); None: not checked.

    Raises:
        ConfigError: Naming each class, its hooks and the fix; every problem at once.
    """
    problems = [] if strategy is None else _hook_problems("strategy", strategy, LOOP_HOOKS | STRATEGY_HOOKS)
    for i, callback in enumerate(callbacks):
        cls = type(callback)
        label = f"callbacks[{i}]={cls.__module__}.{cls.__qualname__}"
        hooks = trainer_only_hooks(callback)
        problems += [_misspelt(label, h, LOOP_HOOKS) for h in hooks if not _is_lightning_hook(h)]
        hooks = [h for h in hooks if _is_lightning_hook(h)]
        known = _trainer_callback(cls)
        if not hooks and known is None and _lightning_class(cls) and _class_hooks(cls):
            problems.append(  # its hooks are the loop's names, but they expect a Trainer and a LightningModule
                f"{label} is written for Lightning's Trainer: the federated loop would call its "
                f"{', '.join(_class_hooks(cls))} with its own contexts, not a Trainer, and it would fail. Use a "
                "callback that implements the loop's hooks instead: " + ", ".join(sorted(LOOP_HOOKS))
            )
            continue
        if not hooks and known is None:
            continue
        relies = f"relies on {', '.join(hooks)}" if hooks else "is written for Lightning's Trainer"
        instead = known or (
            "a callback that implements the loop's hooks instead: "
            + ", ".join(sorted(LOOP_HOOKS))
            + "".join(f" (for {h}: {_instead(h)})" for h in hooks if h in _HOOK_INSTEAD)
        )
        problems.append(f"{label} {relies}, which the federated loop never calls (it would do nothing). Use {instead}")
    if module is not None:
        problems += _hook_problems("model", module, MODULE_HOOKS, on_module=True)
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

    @override
    def __repr__(self) -> str:
        return f"EarlyStopping(patience={self.patience}, min_delta={self.min_delta}, metric={self.metric!r})"

    @override
    def on_fit_start(self, trainer: ServerContext, pl_module: FederatedModule) -> None:
        metric = self._metric(trainer)
        known = getattr(pl_module, "higher_is_better", {})
        if known and metric not in known:
            raise ConfigError(f"EarlyStopping: metric={metric!r} is not one of {sorted(known)}.")
        if not any(trainer.num_examples(c, "val") for c in trainer.client_ids):
            raise ConfigError(
                "EarlyStopping watches the mean validation metric, but no client has a validation "
                "split. Give the clients one (data.init_args) or remove the callback."
            )
        if self.wait >= self.patience:  # restored from a run that had stopped
            self._stop(trainer, metric)

    def on_round_end(
        self, trainer: ServerContext, pl_module: FederatedModule, server_round: int, metrics: dict[str, float]
    ) -> None:
        """Count this round if it was evaluated; stop the run after ``patience`` rounds without improvement."""
        if not metrics:
            return
        metric = self._metric(trainer)
        key = f"server/val/{metric}_mean"
        if key not in metrics:
            raise ConfigError(
                f"EarlyStopping: round {server_round} has no {key} to watch (the data has no "
                "validation split, or no client has a value). Give the clients a validation split "
                "or remove the callback."
            )
        value = float(metrics[key])
        higher = pl_module.higher_is_better.get(metric, True)
        improved = math.isfinite(value) and (
            self.best is None or (value - self.best if higher else self.best - value) > self.min_delta
        )
        if improved:
            self.best, self.best_round, self.wait = value, server_round, 0
        else:
            self.wait += 1
        if self.wait >= self.patience:
            self._stop(trainer, metric)

    def _metric(self, trainer: ServerContext) -> str:
        return self.metric or trainer.history.selection_metric

    def _stop(self, trainer: ServerContext, metric: str) -> None:
        best = "none finite" if self.best is None else f"best {self.best:.6g} at round {self.best_round}"
        trainer.request_stop(
            f"EarlyStopping: mean validation {metric} did not improve by more than "
            f"{self.min_delta:g} for {self.wait} evaluated rounds ({best})"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_round": self.best_round, "wait": self.wait}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_round, self.wait = state_dict["best"], state_dict["best_round"], state_dict["wait"]
