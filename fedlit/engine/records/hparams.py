"""The hyperparameters and final metrics a run shows in TensorBoard's HParams view.

A curated set, the same columns in every run, so that runs of different recipes line up: the strategy (class
name) and its settings (``strategy.<name>``, from its ``hparams()``), each extra callback's arguments
(``callbacks.<class>.<name>``), the backbone and data set classes, the
partitioner, the number of clients, rounds, clients per round, local training (``3 epochs`` or ``100 steps``),
learning rate, precision and seed. Paths and display settings (``out_dir``, ``ckpt_path``, ``progress_bar``) are
never among them. The metrics are ``hparams/<when>/<split>/<metric>_<agg>``: ``when`` is ``last`` (the last
round) or ``best`` (the best-validation round), ``split`` is ``val`` or ``test``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedlit.core.init_args import hparams_of
from fedlit.engine.records.history import summarize

if TYPE_CHECKING:
    from fedlit.engine.records.state import RecordedRun

_SCALARS = (bool, int, float, str)


def hparams(run: RecordedRun) -> dict[str, Any]:
    """The curated hyperparameters of ``fed`` (numbers and strings only)."""
    datamodule, module = run.datamodule, run.module
    manifest_partitioner = getattr(getattr(datamodule, "data", None), "partitioner", None)
    settings = run.settings
    local = f"{settings.local_steps} steps" if settings.local_steps is not None else f"{settings.local_epochs} epochs"
    per_round = settings.clients_per_round if settings.clients_per_round is not None else len(run.train_client_ids)
    out: dict[str, Any] = {
        "strategy": type(run.strategy).__name__,
        "backbone": _backbone(run),
        "dataset": type(datamodule).__name__,
        "partitioner": str(manifest_partitioner) if manifest_partitioner is not None else "-",
        "num_clients": len(run.client_ids),
        "clients_per_round": per_round,
        "rounds": run.settings.rounds,
        "local_training": local,
        "lr": _scalar(getattr(module, "lr", None)),
        "precision": str(run.fabric.strategy.precision.precision),
        "seed": run.settings.seed,
    }
    out.update({f"strategy.{k}": _scalar(v) for k, v in run.strategy.hparams().items()})
    for callback in run.callbacks[1:]:  # each extra callback's arguments (fedlit.core.init_args)
        out.update({f"callbacks.{type(callback).__name__}.{k}": _scalar(v) for k, v in hparams_of(callback).items()})
    return out


def _backbone(run: RecordedRun) -> str:
    """The backbone's class as the recipe names it (``SmallCNN``), else the class of ``module.backbone``."""
    node: Any = run.config.get("model", {})
    for key in ("init_args", "backbone", "class_path"):
        node = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(node, str):
        return node.rsplit(".", 1)[-1]
    backbone = getattr(run.module, "backbone", None)
    return type(backbone).__name__ if backbone is not None else "-"


def _scalar(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    return "-" if value is None else str(value)


def metrics(run: RecordedRun) -> dict[str, float]:
    """``hparams/{last,best}/{val,test}/<metric>_<agg>`` from the evaluation history."""
    history, out = run.state.history, {}
    for when, server_round in (("last", history.last_round), ("best", history.best_round())):
        for split, per_client in history.rounds.get(server_round, {}).items() if server_round is not None else ():
            if split not in ("val", "test"):  # the global model's splits: the same columns in every run
                continue
            weights = {c: run.datamodule.num_examples(c, split) for c in per_client}
            summary = summarize(per_client, weights, run.module.higher_is_better)
            out.update({f"hparams/{when}/{split}/{k}": v for k, v in summary.items()})
    return out


def log(run: RecordedRun) -> None:
    """Give :func:`hparams` and :func:`metrics` to every logger (metrics where the logger takes them)."""
    params, values = hparams(run), metrics(run)
    for logger in run.fabric.loggers:
        takes_metrics = "metrics" in inspect.signature(logger.log_hyperparams).parameters
        if takes_metrics:
            logger.log_hyperparams(params, metrics=values)
            continue
        if values:
            logger.log_metrics(values, step=history_step(run))
        with contextlib.suppress(NotImplementedError):  # Fabric's CSVLogger has no hyperparameters
            logger.log_hyperparams(params)


def history_step(run: RecordedRun) -> int:
    """The step at which the final metrics are logged: the last evaluated round."""
    return run.state.history.last_round or 0
