"""Extra metrics by name for :class:`~fedlit.tasks.ClassificationModule` (its ``extra_metrics`` option).

A metric is registered once, with a factory that builds a fresh ``torchmetrics.Metric`` for a task and a number of
classes, and its direction (``higher_is_better``, what ``fedlit report`` ranks by)::

    register_metric("challenge", "my_package.metrics:challenge_metric", higher_is_better=True)
    register_metric("challenge", challenge_metric, higher_is_better=True)

The factory is called as ``factory(task, num_classes)`` (``task``: ``multiclass``, ``binary`` or ``multilabel``)
and its metric is updated like the built-in ones: ``update(probs, targets)``, with softmax probabilities (N, C)
and integer classes (N,) for ``multiclass``, sigmoid probabilities shaped like the targets and 0/1 integer
targets for ``binary`` and ``multilabel``. A factory may be given as ``"module:attribute"``: it is imported when
a module first builds the metric, so registering it imports nothing.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torchmetrics

from fedlit.core.errors import ConfigError

__all__ = ["METRICS", "MetricEntry", "build_metric", "metric_entry", "register_metric", "registered_metrics"]

Factory = Callable[[str, int], torchmetrics.Metric]
#: ClassificationModule's built-in metrics (and its loss): names a registered metric cannot take.
METRICS = ("accuracy", "balanced_accuracy", "f1", "auroc", "auprc")


@dataclass(frozen=True)
class MetricEntry:
    """A registered metric: its factory (a callable or a ``"module:attribute"`` path) and its direction."""

    name: str
    factory: Factory | str
    higher_is_better: bool

    def resolve(self) -> Factory:
        """The factory, imported first when it was registered as ``"module:attribute"``."""
        if not isinstance(self.factory, str):
            return self.factory
        module_name, _, attribute = self.factory.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise ConfigError(
                f"extra metric {self.name!r}: its factory {self.factory!r} cannot be imported ({err})."
            ) from err


_REGISTRY: dict[str, MetricEntry] = {}


def register_metric(name: str, factory: Factory | str, higher_is_better: bool) -> None:
    """Register the metric ``name`` (``extra_metrics: [name]``).

    Args:
        name: Its name, as in ``extra_metrics`` and in the metric keys (``client/<id>/test/<name>``); not one of
            the built-in metrics (accuracy, balanced_accuracy, f1, auroc, auprc, loss).
        factory: ``factory(task, num_classes) -> torchmetrics.Metric``, or ``"module:attribute"`` naming it.
        higher_is_better: Its direction (the report ranks by it, the best round is selected by it).

    Raises:
        ConfigError: For a built-in name, a factory that is neither, a direction that is not a bool, or a name
            registered before with another factory or direction.
    """
    problems = []
    if not isinstance(name, str) or not name.isidentifier() or name in (*METRICS, "loss"):
        problems.append(f"name={name!r} must be an identifier other than {[*METRICS, 'loss']}")
    if isinstance(factory, str) and (factory.count(":") != 1 or not all(factory.split(":"))):
        problems.append(f"factory={factory!r} must be a callable or 'module:attribute'")
    elif not isinstance(factory, str) and not callable(factory):
        problems.append(f"factory={factory!r} must be a callable or 'module:attribute'")
    if not isinstance(higher_is_better, bool):
        problems.append(f"higher_is_better={higher_is_better!r} must be true or false")
    entry = MetricEntry(name, factory, higher_is_better)
    if not problems and name in _REGISTRY and _REGISTRY[name] != entry:
        problems.append(f"{name!r} is registered already ({_REGISTRY[name]}); register it once")
    if problems:
        raise ConfigError("register_metric: " + "; ".join(problems))
    _REGISTRY[name] = entry


def registered_metrics() -> list[str]:
    """The names registered, sorted."""
    return sorted(_REGISTRY)


def metric_entry(name: str, option: str = "extra_metrics") -> MetricEntry:
    """The entry of ``name``.

    Raises:
        ConfigError: For an unregistered name, naming ``option``, the registered names and the closest one.
    """
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        raise ConfigError(
            f"{option}: {name!r} is not a registered metric; registered: {registered_metrics()}"
            + (f" (closest: {close[0]!r})" if close else "")
            + ". Register it with fedlit.tasks.metric_registry.register_metric before the module is built."
        )
    return _REGISTRY[name]


def build_metric(name: str, task: str, num_classes: int) -> Any:
    """A fresh metric ``name`` for ``task`` and ``num_classes`` (see :func:`register_metric`)."""
    metric = metric_entry(name).resolve()(task, num_classes)
    if not isinstance(metric, torchmetrics.Metric):
        raise ConfigError(
            f"extra metric {name!r}: its factory returned {type(metric).__name__}, not a torchmetrics.Metric."
        )
    return metric
