"""The hyperparameters and final metrics a run shows in TensorBoard's HParams view.

A curated set, the same columns in every run, so that runs of different recipes line up: the strategy (class
name) and its settings (``strategy.<name>``, from its ``hparams()``), the backbone and data set classes, the
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

from fedlit.engine.history import summarize

if TYPE_CHECKING:
    from fedlit.federation import Federation

_SCALARS = (bool, int, float, str)


def hparams(fed: Federation) -> dict[str, Any]:
    """The curated hyperparameters of ``fed`` (numbers and strings only)."""
    datamodule, module = fed.datamodule, fed.module
    manifest_partitioner = getattr(datamodule.data, "partitioner", None)
    local = f"{fed.local_steps} steps" if fed.local_steps is not None else f"{fed.local_epochs} epochs"
    per_round = fed.clients_per_round if fed.clients_per_round is not None else len(fed.train_client_ids)
    out: dict[str, Any] = {
        "strategy": type(fed.strategy).__name__,
        "backbone": _backbone(fed),
        "dataset": type(datamodule).__name__,
        "partitioner": str(manifest_partitioner) if manifest_partitioner is not None else "-",
        "num_clients": len(fed.client_ids),
        "clients_per_round": per_round,
        "rounds": fed.rounds,
        "local_training": local,
        "lr": _scalar(getattr(module, "lr", None)),
        "precision": str(fed.fabric.strategy.precision.precision),
        "seed": fed.seed,
    }
    out.update({f"strategy.{k}": _scalar(v) for k, v in fed.strategy.hparams().items()})
    return out


def _backbone(fed: Federation) -> str:
    """The backbone's class as the recipe names it (``SmallCNN``), else the class of ``module.backbone``."""
    node: Any = fed.config.get("model", {})
    for key in ("init_args", "backbone", "class_path"):
        node = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(node, str):
        return node.rsplit(".", 1)[-1]
    backbone = getattr(fed.module, "backbone", None)
    return type(backbone).__name__ if backbone is not None else "-"


def _scalar(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    return "-" if value is None else str(value)


def metrics(fed: Federation) -> dict[str, float]:
    """``hparams/{last,best}/{val,test}/<metric>_<agg>`` from the evaluation history."""
    history, out = fed.history, {}
    for when, server_round in (("last", history.last_round), ("best", history.best_round())):
        for split, per_client in history.rounds.get(server_round, {}).items() if server_round is not None else ():
            if split not in ("val", "test"):  # the global model's splits: the same columns in every run
                continue
            weights = {c: fed.datamodule.num_examples(c, split) for c in per_client}
            summary = summarize(per_client, weights, fed.module.higher_is_better)
            out.update({f"hparams/{when}/{split}/{k}": v for k, v in summary.items()})
    return out


def log(fed: Federation) -> None:
    """Give :func:`hparams` and :func:`metrics` to every logger (metrics where the logger takes them)."""
    params, values = hparams(fed), metrics(fed)
    for logger in fed.fabric.loggers:
        takes_metrics = "metrics" in inspect.signature(logger.log_hyperparams).parameters
        if takes_metrics:
            logger.log_hyperparams(params, metrics=values)
            continue
        if values:
            logger.log_metrics(values, step=history_step(fed))
        with contextlib.suppress(NotImplementedError):  # Fabric's CSVLogger has no hyperparameters
            logger.log_hyperparams(params)


def history_step(fed: Federation) -> int:
    """The step at which the final metrics are logged: the last evaluated round."""
    return fed.history.last_round or 0
