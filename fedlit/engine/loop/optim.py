"""The local optimizer and its learning-rate schedule: what ``configure_optimizers`` may return, and when a
schedule steps.

``configure_optimizers`` returns one of Lightning's forms, checked by :func:`unpack`:

- an optimizer;
- ``{"optimizer": opt}``, ``{"optimizer": opt, "lr_scheduler": sched}`` or
  ``{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "round" | "step"}}`` (``interval``
  defaults to ``round``; ``name`` is accepted and ignored).

A schedule has one of two intervals:

- ``round``: one schedule for the whole federation, held by the server and stepped once per server round, after
  aggregation. In round ``t`` (counting from 1) every client trains with the schedule's value after ``t - 1``
  steps (round 1 at the optimizer's own learning rate), as Lightning's ``epoch`` interval gives epoch ``t - 1``
  the value after ``t - 1`` steps. The scheduler and the hyperparameters it sets are in the checkpoint.
- ``step``: one schedule per client turn, stepped after each local optimizer step that happened (a step that
  16-bit mixed precision's gradient scaler skipped does not advance it). With ``federation.optimizer_state:
  persist`` the scheduler's state is kept per client beside its optimizer state, so a client's schedule goes on
  where its previous turn stopped; with ``reset`` it restarts at every turn, as the optimizer does.

Several optimizers, a list of schedulers and schedules that need a monitored metric (``ReduceLROnPlateau``) are
refused.

A client turn with one of :class:`~fedlit.module.FederatedModule`'s own optimizers (``sgd``, ``adam``, ``adamw``,
``configure_optimizers`` not overridden, no learning-rate scheduler) does not build one per turn
(:func:`reused_optimizer`): one optimizer per set of trainable parameters is kept on the module and handed back with
an empty state and the hyperparameters it was built with, which is what a fresh one holds. Building it (and Fabric's
wrapper) cost more than a small model's step, once per client turn.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from fedlit.core.errors import CheckpointError, ConfigError, broken

if TYPE_CHECKING:
    from fedlit.module import FederatedModule

INTERVALS = ("round", "step")
#: Where a client's ``step`` schedule is kept in the store (beside its optimizer state).
STORE_KEY = "fedlit.lr_scheduler"
_FORMS = (
    "return one optimizer, or {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'interval': 'round' | 'step'}}"
)


@dataclass
class LocalOptimizer:
    """What ``configure_optimizers`` returned, checked.

    Attributes:
        optimizer: The local optimizer.
        scheduler: Its learning-rate scheduler, or None.
        interval: ``round`` or ``step`` (meaningful with a scheduler only).
    """

    optimizer: Optimizer
    scheduler: LRScheduler | None = None
    interval: str = "round"


def unpack(module: FederatedModule, returned: Any) -> LocalOptimizer:
    """Check one of the forms of the module docstring and return its parts.

    Raises:
        ConfigError: For any other form, naming the module's class and the forms accepted.
    """
    owner = f"{type(module).__name__}.configure_optimizers"
    if isinstance(returned, Optimizer):
        return LocalOptimizer(returned)
    if not isinstance(returned, Mapping):
        kind = (
            f"a {type(returned).__name__} of {len(returned)}"
            if isinstance(returned, (list, tuple))
            else f"a {type(returned).__name__}"
        )
        raise ConfigError(
            f"{owner} returned {kind}: a client trains with one optimizer and at most one "
            f"learning-rate scheduler; {_FORMS}."
        )
    extra = sorted(set(returned) - {"optimizer", "lr_scheduler"})
    if extra or not isinstance(returned.get("optimizer"), Optimizer):
        why = f"unsupported keys {extra}" if extra else "no torch.optim.Optimizer under 'optimizer'"
        raise ConfigError(f"{owner} returned a dict with {why} (a monitored metric is not supported); {_FORMS}.")
    scheduler, interval = returned.get("lr_scheduler"), "round"
    if isinstance(scheduler, Mapping):
        extra = sorted(set(scheduler) - {"scheduler", "interval", "name"})
        interval = scheduler.get("interval", "round")
        if extra or interval not in INTERVALS:
            why = f"unsupported keys {extra}" if extra else f"interval={interval!r} (not one of {list(INTERVALS)})"
            raise ConfigError(
                f"{owner}: the 'lr_scheduler' dict has {why}. 'round' steps the schedule once per "
                f"server round, 'step' after each local optimizer step; {_FORMS}."
            )
        scheduler = scheduler.get("scheduler")
    if scheduler is not None:
        _check_scheduler(owner, scheduler, returned["optimizer"])
    return LocalOptimizer(returned["optimizer"], scheduler, interval)


def _check_scheduler(owner: str, scheduler: Any, optimizer: Optimizer) -> None:
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ConfigError(
            f"{owner}: ReduceLROnPlateau is not supported (it needs a monitored metric, which local "
            "training does not give it). Use a fixed schedule such as CosineAnnealingLR or LinearLR."
        )
    if not isinstance(scheduler, LRScheduler):
        raise ConfigError(
            f"{owner}: the learning-rate scheduler is a {type(scheduler).__name__}, not a "
            f"torch.optim.lr_scheduler.LRScheduler; {_FORMS}."
        )
    if scheduler.optimizer is not optimizer:
        raise ConfigError(
            f"{owner}: the learning-rate scheduler was built on another optimizer than the one "
            "returned; build it on that optimizer."
        )


class RoundSchedule:
    """The server's schedule of ``interval: round``: a scheduler on a reference optimizer that never steps its
    parameters; each client's optimizer takes the reference's hyperparameters (``lr``, and any other key the
    scheduler moves, such as OneCycleLR's momentum) at the start of its turn.

    Args:
        local: A checked ``configure_optimizers`` result whose interval is ``round``.
    """

    def __init__(self, local: LocalOptimizer) -> None:
        if not (local.scheduler is not None):  # an interval comes with a scheduler
            raise broken("an interval comes with a scheduler")
        self.optimizer, self.scheduler = local.optimizer, local.scheduler

    def apply(self, optimizer: Optimizer) -> None:
        """Set ``optimizer``'s hyperparameters (everything but the parameters) to this round's values."""
        reference = self.optimizer.param_groups
        if len(optimizer.param_groups) != len(reference):
            raise ConfigError(
                f"configure_optimizers returned {len(optimizer.param_groups)} parameter groups for a "
                f"client but {len(reference)} at set-up: it must build the same groups every call."
            )
        for group, ref in zip(optimizer.param_groups, reference, strict=True):
            group.update({k: v for k, v in ref.items() if k != "params"})

    def step(self) -> None:
        """Advance the schedule by one round."""
        with warnings.catch_warnings():
            # The reference optimizer never steps: torch's check of the call order does not apply.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()

    def learning_rates(self) -> list[float]:
        """The learning rate of each parameter group in the current round."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state and the reference hyperparameters (some schedulers compute from the current lr)."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        return {"scheduler": self.scheduler.state_dict(), "param_groups": groups}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.scheduler.load_state_dict(dict(state["scheduler"]))
        for group, saved in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            group.update(saved)


def round_schedule(module: FederatedModule) -> RoundSchedule | None:
    """Check what ``module.configure_optimizers`` returns and build the server's schedule if its interval is
    ``round`` (None otherwise)."""
    local = unpack(module, module.configure_optimizers())
    if local.scheduler is None or local.interval != "round":
        return None
    return RoundSchedule(local)


def restore_round_schedule(schedule: RoundSchedule | None, payload: Mapping[str, Any]) -> None:
    """Load the server's schedule from a checkpoint; refuse a checkpoint whose run had another kind of schedule."""
    saved = payload.get("lr_schedule")
    if (saved is None) != (schedule is None):
        had = "had" if saved is not None else "had no"
        raise CheckpointError(
            f"The checkpoint's run {had} a learning-rate schedule stepped per round, this one "
            f"{'has none' if saved is not None else 'has one'}: resume with the same "
            "model.init_args.lr_scheduler and lr_scheduler_interval."
        )
    if saved is not None and schedule is not None:
        schedule.load_state_dict(saved)


def reused_optimizer(module: FederatedModule) -> tuple[Optimizer, Any] | None:
    """The module's own optimizer over its parameters that train now, reset to what ``configure_optimizers`` would
    build (an empty state, the hyperparameters it was built with), and its Fabric wrapper kept by
    :func:`keep_wrapped` (None until then); None when ``configure_optimizers`` may build something else (overridden,
    a callable optimizer or a scheduler)."""
    from fedlit.module import FederatedModule  # a layer above: imported when first used, as in the type hints

    own = getattr(module.configure_optimizers, "__func__", None) is FederatedModule.configure_optimizers
    if (
        not own  # overridden by a subclass or on the instance
        or getattr(module, "optimizer_factory", None) is not None
        or getattr(module, "lr_scheduler_factory", None) is not None
    ):
        return None
    kept: dict[tuple[int, ...], _Kept] = module.derived("fedlit.optimizers", dict)
    key = tuple(id(p) for p in module.derived("parameters", lambda: list(module.parameters())) if p.requires_grad)
    entry = kept.get(key)
    if entry is None:
        optimizer = unpack(module, module.configure_optimizers()).optimizer
        entry = kept[key] = _Kept(optimizer, [dict(g) for g in optimizer.param_groups])
    else:
        entry.optimizer.state.clear()
        for group, built in zip(entry.optimizer.param_groups, entry.groups, strict=True):
            group.clear()
            group.update(built)  # in place: Fabric's wrapper shares the groups
    in_use: list[tuple[int, ...]] = module.derived("fedlit.optimizer_in_use", list)
    in_use[:] = [key]
    return entry.optimizer, entry.wrapped


def keep_wrapped(module: FederatedModule, wrapped: Any) -> Any:
    """Keep Fabric's wrapper of the optimizer :func:`reused_optimizer` last gave (None: drop it, after a
    ``load_state_dict`` that replaced the state it shares); returns ``wrapped``."""
    in_use: list[tuple[int, ...]] = module.derived("fedlit.optimizer_in_use", list)
    kept: dict[tuple[int, ...], _Kept] = module.derived("fedlit.optimizers", dict)
    kept[in_use[0]].wrapped = wrapped
    return wrapped


@dataclass
class _Kept:
    optimizer: Optimizer
    groups: list[dict[str, Any]]
    wrapped: Any = None
