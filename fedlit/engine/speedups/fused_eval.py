"""Fused evaluation (``federation.fused_clients: K``): the evaluation batches of K clients in one forward pass.

Evaluating many clients of one frozen backbone one after the other runs many small forward passes (a client of a
1,000-client federation may hold a single test sample); fusing runs one pass over the batches of K clients. For a
group of evaluation tasks, each evaluated model gets its own trainable tensors
(:class:`~fedlit.engine.speedups.fused_model.ClientParameters`): a client's personalized model (its personal tensors
from the store, what ``configure_evaluate`` sent, then the strategy's ``on_client_evaluate_start``) and, for a strategy
with a global model, the client's global-model evaluation (its personal tensors and ``global_model_state``), loaded
exactly as :func:`~fedlit.engine.loop.evaluate.evaluate_client` loads them. Then, split by split, one batch of each
model's loader at a time is concatenated and run once through the module in eval mode without gradients, each sample
through its own model's tensors, and each model keeps its logits and targets (not its inputs). Last, each model's
metrics are computed as a sequential evaluation computes them, from its own logits in its own batch order
(``reset_metrics``, :meth:`~fedlit.tasks.ClassificationModule.update_metrics` per batch, ``compute_metrics``).

So the metrics are those of the sequential evaluation, up to the rounding of batched matrix products. A task that
fine-tunes before it evaluates (``eval_finetune_steps``) or asks for validation pictures from a module that draws
them is evaluated sequentially, in its place; so is every task when the module's ``validation_step`` is not
:class:`~fedlit.tasks.ClassificationModule`'s. Evaluation runs in eval mode, so the refusals that concern training
(dropout, BatchNorm in train mode) do not arise here, but the executor refuses them at set-up for the whole run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedlit.core.errors import ConfigError, broken
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop.client import load_client
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.evaluate import GLOBAL, eval_loaders
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask
from fedlit.engine.speedups.fused_model import ClientParameters
from fedlit.module import FederatedModule
from fedlit.tasks.classification import ClassificationModule


def fuses_evaluation(module: FederatedModule) -> bool:
    """Whether ``module`` computes its evaluation metrics from its logits as :class:`ClassificationModule` does."""
    return isinstance(module, ClassificationModule) and (
        type(module).validation_step is ClassificationModule.validation_step
    )


def fuses_task(module: FederatedModule, task: EvaluateTask) -> bool:
    """Whether ``task`` can be evaluated in a fused pass (no fine-tuning first, no validation picture to draw)."""
    draws_images = type(module).validation_images is not FederatedModule.validation_images
    return task.finetune_steps == 0 and not (task.images and draws_images)


@dataclass
class _Model:
    """One evaluated model of a fused group: a client's personalized model, or its global-model evaluation."""

    ctx: ClientContext
    received: Mapping[str, Tensor]
    personalized: bool
    splits: tuple[str, ...]
    pooled: tuple[str, ...] = ()
    loaders: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, list[tuple[Tensor, Tensor]]] = field(default_factory=dict)
    #: Per split of ``pooled``, the module's ``pooled_predictions()`` (set by :func:`_metrics`).
    predictions: dict[str, Any] = field(default_factory=dict)


def evaluate_group(ctxs: list[ClientContext], server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
    """The evaluations of ``tasks`` (one context each, same live module), their forward passes fused."""
    module = ctxs[0].module
    models: list[_Model] = []
    owners: list[list[int]] = []  # per task, its models' indices
    for ctx, task in zip(ctxs, tasks, strict=True):
        owners.append([len(models)])
        models.append(_Model(ctx, task.received, True, task.splits, task.pooled))
        if task.global_state is not None:
            owners[-1].append(len(models))
            models.append(_Model(ctx, task.global_state, False, task.splits, task.pooled))
    params = ClientParameters(module, len(models))
    last = len(models) - 1
    try:
        for k, model in enumerate(models):
            model.loaders = eval_loaders(model.ctx, model.splits)
            if model.loaders:
                params.bind(k)
                _load(model, server_round)
                last = k
        module.eval()
        for split in dict.fromkeys(s for t in tasks for s in t.splits):
            _forward_split(module, params, models, split)
        results = []
        for indices in owners:
            metrics: dict[str, dict[str, float]] = {}
            predictions: dict[str, Any] = {}
            download = 0
            for k in indices:
                model = models[k]
                prefix = "" if model.personalized else f"{GLOBAL}/"
                metrics.update({f"{prefix}{s}": v for s, v in _metrics(model).items()})
                predictions.update({f"{prefix}{s}": v for s, v in model.predictions.items()})
                download += state_nbytes(model.received) if model.loaders else 0
            results.append(EvaluateResult(metrics, download, pooled=predictions))
    finally:
        params.restore(last)  # the live module holds the last evaluated model, as after sequential evaluations
    return results


def _load(model: _Model, server_round: int) -> None:
    """Put the model's tensors into the live module (bound to its own), as a sequential evaluation does."""
    ctx = model.ctx
    load_client(ctx, model.received)
    if model.personalized:  # the global model is evaluated as received, never with a model the client keeps
        ctx.hooks.call(
            "on_client_evaluate_start",
            client_states=ctx.store,
            **ctx.hook_args(),
            server_round=server_round,
            client_id=ctx.client_id,
        )


def _forward_split(module: Any, params: ClientParameters, models: list[_Model], split: str) -> None:
    """Every model's logits and targets on ``split``: one batch of each model's loader per fused forward pass."""
    streams: list[tuple[int, Iterator[Any]]] = [
        (k, iter(m.loaders[split])) for k, m in enumerate(models) if split in m.loaders
    ]
    for k, _ in streams:
        models[k].outputs[split] = []
    while streams:
        batches, alive = [], []
        for k, stream in streams:
            batch = next(stream, None)
            if batch is None:
                continue
            alive.append((k, stream))
            inputs, targets = models[k].ctx.prepare_batch(batch)
            if not isinstance(inputs, Tensor):
                raise ConfigError(
                    f"federation.fused_clients: client {models[k].ctx.client_id!r}'s inputs are a "
                    f"{type(inputs).__name__}, not one tensor to concatenate: keep "
                    "federation.fused_clients: 1."
                )
            batches.append((k, inputs, targets))
        streams = alive
        if not batches:
            break
        sizes = [len(targets) for _, _, targets in batches]
        ctx = models[batches[0][0]].ctx
        with torch.no_grad(), params.fused([k for k, _, _ in batches], sizes), ctx.autocast():
            logits = module(torch.cat([inputs for _, inputs, _ in batches]))
        for (k, _, targets), part in zip(batches, logits.split(sizes), strict=True):
            models[k].outputs[split].append((part, targets))


def _metrics(model: _Model) -> dict[str, dict[str, float]]:
    """The model's metrics per split, from its kept logits, as ``validation_step`` would have accumulated them (and
    its ``pooled_predictions()`` of the splits it pools, kept in ``model.predictions``)."""
    module, out = model.ctx.module, {}
    if not (isinstance(module, ClassificationModule)):  # the executor fuses only such modules (see above)
        raise broken("the executor fuses only such modules (see above)")
    for split, outputs in model.outputs.items():
        module.reset_metrics()
        with torch.no_grad(), model.ctx.autocast():
            for logits, targets in outputs:
                module.update_metrics(logits, targets)
        out[split] = module.compute_metrics()
        if split in model.pooled and (kept := module.pooled_predictions()) is not None:
            model.predictions[split] = kept
    return out
