"""The evaluation phase: every client's model on its own validation and test splits, and the final report.

Each evaluated client downloads what :meth:`~fedlit.strategies.base.Strategy.configure_evaluate` gives it (once per
evaluated round, for both splits); those bytes are counted as ``comm/eval_download_bytes``, beside the training
traffic. Then ``on_client_evaluate_start`` lets a strategy put a model the client holds into the live module (a
personal model kept in its ``client_state``; not for the global model below). Validation metrics are logged per
round; test metrics are recorded for the final report only (nothing is chosen or shown per round on test). A module
whose ``validation_images()`` draws its validation examples (segmentation) has that picture logged per client and
round, to the loggers that take images (TensorBoard).

**Pooled metrics** (``federation.pooled_metrics``, on by default): at every evaluated round the module's test
metrics are also computed over every evaluated client's test samples together (FLamby's "pooled" figure, beside the
mean over clients): each client's evaluation keeps the module's ``pooled_predictions()`` of its test split (per-sample
scores and targets, or per-image counts) and the server's module computes ``pooled_metrics`` of them, recorded in the
history beside the per-client values (``pooled`` in ``results.json``'s ``last`` and ``best``). A module without a
pooled form has none, and so has a Flower deployment: its nodes never send their patients' predictions.

Personalized methods are evaluated three more ways:

- **The global model.** A strategy whose :meth:`~fedlit.strategies.base.Strategy.global_model_state` is not None
  (PGFed's ``theta_glob``, EPFL's mean A, APPLE's p0-mix of the cores, FedMetaMed's deputy) has every client also
  evaluated with it, at every evaluated round: its shared tensors are replaced by the global ones and its *personal
  tensors are kept* (a personal head, LoRA B, normalization statistics), since the server has no personal tensors to
  give. The results are the history's ``global/val`` and ``global/test`` splits, logged as
  ``global/client/<id>/val/<metric>`` and ``global/server/val/<metric>_<agg>``, and reported (last round, and the
  run's best round: the one chosen on the personalized validation) under ``global`` in ``results.json``. Their
  downloads count as evaluation traffic.
- **Unseen clients** (``federation.unseen_clients``): never trained, left out of every per-round evaluation and
  mean, they are tested once, at the final report, with the server state of the last round: with what the
  strategy sends a client that has not trained (:meth:`~fedlit.strategies.base.Strategy.configure_evaluate`, the
  global model for FedAvg, PGFed and EPFL) and their initial personal tensors (every rank of a multi-device run
  holds both, and tests them itself with the same result; see :mod:`fedlit.engine.loop.ranks`), then, with
  ``federation.unseen_finetune_steps: k > 0``, again after k plain local optimizer steps from it on their own
  train split (the module's loss and optimizer at the last round's learning rate, no strategy term: a newcomer
  fine-tuning what it was given, as PGFed's paper evaluates new clients). Reported under ``unseen`` in
  ``results.json`` and as ``unseen/client/<id>/test/<metric>`` and ``unseen_finetuned/client/<id>/test/<metric>``.
- **The gain over Local** (``--baseline_run``): see :mod:`fedlit.engine.records.baseline`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from fedlit.core.errors import DataError, broken
from fedlit.core.seeding import manual_seed
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop import optim
from fedlit.engine.loop.client import batch_statistics_layers, load_client, skip_single_sample
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.tasks import evaluate_tasks
from fedlit.engine.records import record
from fedlit.engine.records.history import summarize

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

SPLITS = ("val", "test")
#: The history's splits of the global model (:meth:`~fedlit.strategies.base.Strategy.global_model_state`).
GLOBAL = "global"
#: The prefixes of the unseen clients' tags: with the model they receive, and after fine-tuning it.
UNSEEN, UNSEEN_FINETUNED = "unseen", "unseen_finetuned"


def evaluate_client(
    ctx: ClientContext,
    server_round: int,
    splits: tuple[str, ...],
    received: Mapping[str, Tensor],
    personalized: bool = False,
    images: dict[str, Tensor] | None = None,
    finetune_steps: int = 0,
    pooled: tuple[str, ...] = (),
    predictions: dict[str, Any] | None = None,
) -> tuple[dict[str, dict[str, float]], int]:
    """The client's metrics on each of ``splits`` that it has, with its personal tensors and ``received``, and the
    bytes it downloaded for that (0 when it has none of the splits). ``personalized`` lets the strategy put a model
    the client keeps into the live module (``on_client_evaluate_start``); the global model is evaluated as received.
    ``finetune_steps > 0`` (:attr:`~fedlit.strategies.base.Strategy.eval_finetune_steps`) first takes that many
    plain local steps from that model on the client's train split (:func:`local_steps`, seeded by the run's seed,
    the round and the client); nothing of them is kept. With ``images`` given, the module's ``validation_images()``
    after the validation split, if any, is put there under the client's id; with ``predictions`` given, its
    ``pooled_predictions()`` after each of the ``pooled`` splits, when not None, under the split."""
    loaders = eval_loaders(ctx, splits)
    if not loaders:
        return {}, 0
    load_client(ctx, received)
    if personalized:  # the global model is evaluated as received, never with a model the client keeps
        ctx.hooks.call(
            "on_client_evaluate_start",
            client_states=ctx.store,
            **ctx.hook_args(),
            server_round=server_round,
            client_id=ctx.client_id,
        )
    if finetune_steps > 0:
        stream = ("eval-finetune", server_round, ctx.client_id)
        local_steps(
            ctx,
            finetune_steps,
            stream,
            (*stream, "data"),
            f"{type(ctx.strategy).__name__}(finetune_steps={finetune_steps})",
            ctx.strategy.configure_eval_finetune(ctx.module),
        )
    return _run_loaders(ctx, loaders, images, pooled, predictions), state_nbytes(received)


def eval_loaders(ctx: ClientContext, splits: tuple[str, ...]) -> dict[str, Any]:
    """The client's loader of each of ``splits`` that it has (none for an empty split)."""
    loaders = {s: ctx.eval_dataloader(s) for s in splits}
    return {s: loader for s, loader in loaders.items() if loader is not None}


def _run_loaders(
    ctx: ClientContext,
    loaders: Mapping[str, Any],
    images: dict[str, Tensor] | None = None,
    pooled: tuple[str, ...] = (),
    predictions: dict[str, Any] | None = None,
) -> dict[str, dict[str, float]]:
    """The live module's metrics on each loader, as it is (nothing loaded); see :func:`evaluate_client`."""
    module, fabric = ctx.module, ctx.fabric
    precision = fabric.strategy.precision
    module.eval()
    metrics = {}
    for split, loader in loaders.items():
        module.reset_metrics()
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                batch = precision.convert_input(fabric.to_device(batch))
                with fabric.autocast():
                    module.validation_step(batch, batch_idx)
        metrics[split] = module.compute_metrics()
        if predictions is not None and split in pooled:
            kept = module.pooled_predictions()
            if kept is not None:
                predictions[split] = kept
        if split == "val" and images is not None:
            image = module.validation_images()
            if image is not None:
                images[ctx.client_id] = image
    return metrics


def evaluate_round(run: Run, server_round: int) -> dict[str, float]:
    """Evaluate every client but the unseen ones (and each with the global model, if the strategy has one), record
    the round in the history; the validation scalars to log."""
    per_split: dict[str, dict[str, dict[str, float]]] = {s: {} for s in SPLITS}
    per_split.update({f"{GLOBAL}/{s}": {} for s in SPLITS})
    download = steps = 0
    images: dict[str, torch.Tensor] = {}
    clients = run.evaluated_client_ids
    pooled = ("test",) if run.settings.pooled_metrics else ()
    tasks = evaluate_tasks(
        run.strategy, server_round, clients, SPLITS, images=bool(record.image_writers(run)), pooled=pooled
    )
    predictions: dict[str, dict[str, Any]] = {}
    if run.evaluation_reuse is not None:  # clients whose inputs are unchanged keep their last metrics
        results, reused = run.evaluation_reuse.evaluate(run, server_round, tasks)
    else:
        if not (run.executor is not None):  # chosen by setup
            raise broken("the executor is chosen when the run is set up")
        results, reused = run.executor.evaluate(run, server_round, tasks), None
    for client_id, result in zip(clients, results, strict=True):
        download += result.download_bytes
        steps += result.finetune_steps
        if result.image is not None:
            images[client_id] = result.image
        for split, values in result.metrics.items():
            if values:
                per_split[split][client_id] = values
        for split, kept in result.pooled.items():
            predictions.setdefault(split, {})[client_id] = kept
    if images:
        record.log_validation_images(run, server_round, images)
    run.state.comm["eval_download_bytes"] = run.state.comm.get("eval_download_bytes", 0) + download
    log: dict[str, float] = {
        "comm/eval_download_bytes": download,
        "comm/eval_download_bytes_cumulative": run.state.comm["eval_download_bytes"],
    }
    if reused is not None:
        log["system/eval_reused"] = reused
    if run.strategy.eval_finetune_steps:  # the compute that fine-tuning before evaluation adds (FedAvg-FT)
        run.state.compute["eval_finetune_steps"] = run.state.compute.get("eval_finetune_steps", 0) + steps
        log.update(
            {
                "system/eval_finetune_steps": steps,
                "system/eval_finetune_steps_cumulative": run.state.compute["eval_finetune_steps"],
            }
        )
    for split, per_client in per_split.items():
        if not per_client:
            continue
        run.state.history.add(server_round, split, per_client)
        if split.endswith("test"):
            values = pooled_metrics(run, per_client, predictions.get(split, {}))
            if values:
                run.state.history.add_pooled(server_round, split, values)
            continue
        log.update(_scalars(run, split, per_client))
    return log


def pooled_metrics(
    run: Run, per_client: Mapping[str, Mapping[str, float]], predictions: Mapping[str, Any]
) -> dict[str, float]:
    """The module's metrics over the evaluated clients' samples together (its ``pooled_metrics`` of their
    ``pooled_predictions()``, in client order): FLamby's "pooled" figure. {} when a client with metrics has no
    predictions: a module without a pooled form, or a Flower node (which never sends its patients' predictions)."""
    if not per_client or any(c not in predictions for c in per_client):
        return {}
    return run.module.pooled_metrics([predictions[c] for c in per_client])


def _scalars(
    run: Run, split: str, per_client: Mapping[str, Mapping[str, float]], tag_split: str | None = None
) -> dict[str, float]:
    """``[<section>/]client/<id>/<split>/<metric>`` and ``[<section>/]server/<split>/<metric>_<agg>`` of a history
    split (``val``, ``global/val``...); ``tag_split`` replaces the split's name in the tags."""
    section, _, base = split.rpartition("/")
    prefix = f"{section}/" if section else ""
    name = tag_split or base
    weights = {c: run.datamodule.num_examples(c, base) for c in per_client}
    log = {f"{prefix}client/{c}/{name}/{m}": v for c, values in per_client.items() for m, v in values.items()}
    summary = summarize(per_client, weights, run.module.higher_is_better)
    log.update({f"{prefix}server/{name}/{k}": v for k, v in summary.items()})
    return log


# ------------------------------------------------------------------------------------------------ fine-tuning
def local_steps(
    ctx: ClientContext,
    steps: int,
    seed: tuple[Any, ...],
    data: tuple[Any, ...],
    option: str,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Take ``steps`` plain optimizer steps on the module's loss over the client's train split, from the live
    module as it is (cycling through the split): ``optimizer`` if given (a strategy's
    :meth:`~fedlit.strategies.base.Strategy.configure_eval_finetune`), else a fresh one from
    ``configure_optimizers`` at the learning rate the run's schedule holds now; no strategy term or hook. ``seed``
    and ``data`` name the random streams of the steps (dropout) and of the batch order, so the same call gives the
    same steps. Nothing is saved: the next :func:`~fedlit.engine.loop.client.load_client` undoes it. ``option`` names
    the setting in the error raised when the client has no training batch."""
    module, fabric = ctx.module, ctx.fabric
    manual_seed(ctx.derive_seed(*seed))
    loader = ctx.train_dataloader(*data)
    if optimizer is None:
        local = optim.unpack(module, module.configure_optimizers())
        if ctx.lr_schedule is not None:
            ctx.lr_schedule.apply(local.optimizer)
        optimizer = local.optimizer
    # one optimizer in, one wrapper out (Fabric's annotation also allows the tuple of several)
    optimizer = cast(torch.optim.Optimizer, fabric.setup_optimizers(optimizer))
    precision = fabric.strategy.precision
    module.set_train_mode()
    norms = batch_statistics_layers(module)
    done = 0
    while done < steps:
        batches = 0
        for batch_idx, batch in enumerate(loader):
            if skip_single_sample(ctx, batch, norms):  # as in a client's turn: BatchNorm needs two samples
                continue
            batch = precision.convert_input(fabric.to_device(batch))
            with fabric.autocast():
                out = precision.convert_output(module.training_step(batch, batch_idx))
            loss = out["loss"] if isinstance(out, Mapping) else out
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done, batches = done + 1, batches + 1
            if done >= steps:
                break
        if batches == 0:
            raise DataError(
                f"Client {ctx.client_id!r} has no training batch to fine-tune on ({option}): give it "
                "a train split, or set that option to 0."
            )
    # An optimizer over some parameters (a head) leaves the others' gradients behind: none may reach the next turn.
    module.zero_grad(set_to_none=True)


# -------------------------------------------------------------------------------------------- unseen clients
def finetune(ctx: ClientContext, received: Mapping[str, Tensor], steps: int) -> None:
    """Load ``received`` (and the client's personal tensors) into the live module, then take ``steps`` plain local
    steps from it (:func:`local_steps`, seeded by the run's seed and the client)."""
    load_client(ctx, received)
    local_steps(
        ctx,
        steps,
        ("finetune", ctx.client_id),
        ("finetune-data", ctx.client_id),
        f"federation.unseen_finetune_steps={steps}",
    )


def evaluate_unseen(run: Run, split: str = "test") -> dict[str, Any] | None:
    """The unseen clients' ``split`` with what the strategy sends a new client, and after
    ``federation.unseen_finetune_steps`` local steps from it; None without unseen clients. Their downloads count
    as evaluation traffic."""
    clients = run.unseen_client_ids
    if not clients:
        return None
    steps = run.settings.unseen_finetune_steps
    received_model: dict[str, dict[str, float]] = {}
    finetuned: dict[str, dict[str, float]] = {}
    download = 0
    for client_id in clients:
        ctx = run.client_context(client_id)
        received = run.strategy.configure_evaluate(run.state.round, client_id)
        metrics, nbytes = evaluate_client(ctx, run.state.round, (split,), received)
        download += nbytes
        if metrics.get(split):
            received_model[client_id] = metrics[split]
        if steps > 0 and metrics.get(split):
            finetune(ctx, received, steps)
            finetuned[client_id] = _run_loaders(ctx, eval_loaders(ctx, (split,)))[split]
    run.state.comm["eval_download_bytes"] = run.state.comm.get("eval_download_bytes", 0) + download
    weights = {c: run.datamodule.num_examples(c, split) for c in clients}
    out: dict[str, Any] = {"round": run.state.round, "split": split, "finetune_steps": steps}
    for key, per_client in (("global", received_model), ("finetuned", finetuned)):
        if per_client:
            out[key] = {
                "round": run.state.round,
                "clients": per_client,
                "summary": summarize(per_client, weights, run.module.higher_is_better),
            }
    return out


def unseen_scalars(run: Run, unseen: Mapping[str, Any]) -> dict[str, float]:
    """``unseen/...`` and ``unseen_finetuned/...`` scalars of :func:`evaluate_unseen`'s result."""
    log: dict[str, float] = {}
    for key, section in (("global", UNSEEN), ("finetuned", UNSEEN_FINETUNED)):
        if key in unseen:
            log.update(_scalars(run, f"{section}/{unseen['split']}", unseen[key]["clients"]))
    return log
