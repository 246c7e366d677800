"""The evaluation phase: every client's model on its own validation and test splits, and the final report.

Each evaluated client downloads what :meth:`~fedlit.strategies.base.Strategy.configure_evaluate` gives it (once per
evaluated round, for both splits); those bytes are counted as ``comm/eval_download_bytes``, beside the training
traffic. Then ``on_client_evaluate_start`` lets a strategy put a model the client holds into the live module (a
personal model kept in its ``client_state``; not for the global model below). Validation metrics are logged per
round; test metrics are recorded for the final report only (nothing is chosen or shown per round on test). A module
whose ``validation_images()`` draws its validation examples (segmentation) has that picture logged per client and
round, to the loggers that take images (TensorBoard).

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
  holds both, and tests them itself with the same result; see :mod:`fedlit.engine.ranks`), then, with
  ``federation.unseen_finetune_steps: k > 0``, again after k plain local optimizer steps from it on their own
  train split (the module's loss and optimizer at the last round's learning rate, no strategy term: a newcomer
  fine-tuning what it was given, as PGFed's paper evaluates new clients). Reported under ``unseen`` in
  ``results.json`` and as ``unseen/client/<id>/test/<metric>`` and ``unseen_finetuned/client/<id>/test/<metric>``.
- **The gain over Local** (``--baseline_run``): see :mod:`fedlit.engine.baseline`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedlit.core.checkpoint_io import BEST
from fedlit.core.errors import DataError
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine import baseline, executor, hparams, optim, record
from fedlit.engine.client import call_with_client_state, load_client
from fedlit.engine.history import markdown_table, summarize

if TYPE_CHECKING:
    from fedlit.federation import Federation

SPLITS = ("val", "test")
#: The history's splits of the global model (:meth:`~fedlit.strategies.base.Strategy.global_model_state`).
GLOBAL = "global"
#: The prefixes of the unseen clients' tags: with the model they receive, and after fine-tuning it.
UNSEEN, UNSEEN_FINETUNED = "unseen", "unseen_finetuned"


def evaluate_client(fed: Federation, server_round: int, client_id: str, splits: tuple[str, ...] = SPLITS,
                    images: dict[str, torch.Tensor] | None = None,
                    received: Mapping[str, torch.Tensor] | None = None,
                    personalized: bool | None = None) -> tuple[dict[str, dict[str, float]], int]:
    """``client_id``'s metrics on each of ``splits`` that it has (personal tensors + what the strategy gives it, or
    ``received`` when given), and the bytes it downloaded for that (0 when it has none of the splits). With
    ``images`` given, the module's ``validation_images()`` after the validation split, if any, is put there under
    ``client_id``. ``personalized`` (by default: ``received`` not given) lets the strategy put a model the client
    keeps into the live module (``on_client_evaluate_start``); the global model is evaluated as received."""
    loaders = _loaders(fed, client_id, splits)
    if not loaders:
        return {}, 0
    if personalized is None:
        personalized = received is None
    if received is None:
        received = fed.strategy.configure_evaluate(server_round, client_id)
    load_client(fed, client_id, received)
    if personalized:  # the global model is evaluated as received, never with a model the client keeps
        call_with_client_state(fed, "on_client_evaluate_start", trainer=fed, pl_module=fed.module,
                               server_round=server_round, client_id=client_id)
    return _run_loaders(fed, client_id, loaders, images), state_nbytes(received)


def _loaders(fed: Federation, client_id: str, splits: tuple[str, ...]) -> dict[str, Any]:
    loaders = {s: fed.datamodule.val_dataloader(client_id) if s == "val" else fed.datamodule.test_dataloader(client_id)
               for s in splits}
    return {s: loader for s, loader in loaders.items() if loader is not None}


def _run_loaders(fed: Federation, client_id: str, loaders: Mapping[str, Any],
                 images: dict[str, torch.Tensor] | None = None) -> dict[str, dict[str, float]]:
    """The live module's metrics on each loader, as it is (nothing loaded)."""
    precision = fed.fabric.strategy.precision
    fed.module.eval()
    metrics = {}
    for split, loader in loaders.items():
        fed.module.reset_metrics()
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                batch = precision.convert_input(fed.fabric.to_device(batch))
                with fed.fabric.autocast():
                    fed.module.validation_step(batch, batch_idx)
        metrics[split] = fed.module.compute_metrics()
        if split == "val" and images is not None:
            image = fed.module.validation_images()
            if image is not None:
                images[client_id] = image
    return metrics


def evaluate_round(fed: Federation, server_round: int) -> dict[str, float]:
    """Evaluate every client but the unseen ones (and each with the global model, if the strategy has one), record
    the round in the history; the validation scalars to log."""
    per_split: dict[str, dict[str, dict[str, float]]] = {s: {} for s in SPLITS}
    per_split.update({f"{GLOBAL}/{s}": {} for s in SPLITS})
    download = 0
    images: dict[str, torch.Tensor] = {}
    clients = fed.evaluated_client_ids
    tasks = executor.evaluate_tasks(fed, server_round, clients, SPLITS, images=bool(record.image_writers(fed)))
    for client_id, result in zip(clients, fed.executor.evaluate(fed, server_round, tasks), strict=True):
        download += result.download_bytes
        if result.image is not None:
            images[client_id] = result.image
        for split, values in result.metrics.items():
            if values:
                per_split[split][client_id] = values
    if images:
        record.log_validation_images(fed, server_round, images)
    fed.comm["eval_download_bytes"] = fed.comm.get("eval_download_bytes", 0) + download
    log: dict[str, float] = {"comm/eval_download_bytes": download,
                             "comm/eval_download_bytes_cumulative": fed.comm["eval_download_bytes"]}
    for split, per_client in per_split.items():
        if not per_client:
            continue
        fed.history.add(server_round, split, per_client)
        if split.endswith("test"):
            continue
        log.update(_scalars(fed, split, per_client))
    return log


def _scalars(fed: Federation, split: str, per_client: Mapping[str, Mapping[str, float]],
             tag_split: str | None = None) -> dict[str, float]:
    """``[<section>/]client/<id>/<split>/<metric>`` and ``[<section>/]server/<split>/<metric>_<agg>`` of a history
    split (``val``, ``global/val``...); ``tag_split`` replaces the split's name in the tags."""
    section, _, base = split.rpartition("/")
    prefix = f"{section}/" if section else ""
    name = tag_split or base
    weights = {c: fed.datamodule.num_examples(c, base) for c in per_client}
    log = {f"{prefix}client/{c}/{name}/{m}": v for c, values in per_client.items() for m, v in values.items()}
    summary = summarize(per_client, weights, fed.module.higher_is_better)
    log.update({f"{prefix}server/{name}/{k}": v for k, v in summary.items()})
    return log


# -------------------------------------------------------------------------------------------- unseen clients
def finetune(fed: Federation, client_id: str, received: Mapping[str, torch.Tensor], steps: int) -> None:
    """Load ``received`` (and ``client_id``'s personal tensors) into the live module, then take ``steps`` plain
    optimizer steps on the module's loss over ``client_id``'s train split (cycling through it; seeded by the run's
    seed and the client). Nothing is saved: the next :func:`~fedlit.engine.client.load_client` undoes it."""
    load_client(fed, client_id, received)
    torch.manual_seed(fed.derive_seed("finetune", client_id))
    loader = fed.datamodule.train_dataloader(
        client_id, torch.Generator().manual_seed(fed.derive_seed("finetune-data", client_id)))
    local = optim.unpack(fed.module, fed.module.configure_optimizers())
    if fed.lr_schedule is not None:
        fed.lr_schedule.apply(local.optimizer)
    optimizer = fed.fabric.setup_optimizers(local.optimizer)
    precision = fed.fabric.strategy.precision
    fed.module.set_train_mode()
    done = 0
    while done < steps:
        batches = 0
        for batch_idx, batch in enumerate(loader):
            batch = precision.convert_input(fed.fabric.to_device(batch))
            with fed.fabric.autocast():
                out = precision.convert_output(fed.module.training_step(batch, batch_idx))
            loss = out["loss"] if isinstance(out, Mapping) else out
            fed.fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done, batches = done + 1, batches + 1
            if done >= steps:
                break
        if batches == 0:
            raise DataError(f"Unseen client {client_id!r} has no training batch to fine-tune on "
                            f"(federation.unseen_finetune_steps={steps}): give it a train split, or set "
                            "federation.unseen_finetune_steps: 0.")


def evaluate_unseen(fed: Federation, split: str = "test") -> dict[str, Any] | None:
    """The unseen clients' ``split`` with what the strategy sends a new client, and after
    ``federation.unseen_finetune_steps`` local steps from it; None without unseen clients. Their downloads count
    as evaluation traffic."""
    clients = fed.unseen_client_ids
    if not clients:
        return None
    steps = fed.unseen_finetune_steps
    received_model: dict[str, dict[str, float]] = {}
    finetuned: dict[str, dict[str, float]] = {}
    download = 0
    for client_id in clients:
        received = fed.strategy.configure_evaluate(fed.server_round, client_id)
        metrics, nbytes = evaluate_client(fed, fed.server_round, client_id, (split,), received=received)
        download += nbytes
        if metrics.get(split):
            received_model[client_id] = metrics[split]
        if steps > 0 and metrics.get(split):
            finetune(fed, client_id, received, steps)
            finetuned[client_id] = _run_loaders(fed, client_id, _loaders(fed, client_id, (split,)))[split]
    fed.comm["eval_download_bytes"] = fed.comm.get("eval_download_bytes", 0) + download
    weights = {c: fed.datamodule.num_examples(c, split) for c in clients}
    out: dict[str, Any] = {"round": fed.server_round, "split": split, "finetune_steps": steps}
    for key, per_client in (("global", received_model), ("finetuned", finetuned)):
        if per_client:
            out[key] = {"round": fed.server_round, "clients": per_client,
                        "summary": summarize(per_client, weights, fed.module.higher_is_better)}
    return out


def unseen_scalars(fed: Federation, unseen: Mapping[str, Any]) -> dict[str, float]:
    """``unseen/...`` and ``unseen_finetuned/...`` scalars of :func:`evaluate_unseen`'s result."""
    log: dict[str, float] = {}
    for key, section in (("global", UNSEEN), ("finetuned", UNSEEN_FINETUNED)):
        if key in unseen:
            log.update(_scalars(fed, f"{section}/{unseen['split']}", unseen[key]["clients"]))
    return log


def _unseen_tables(unseen: Mapping[str, Any], metrics: list[str]) -> list[str]:
    sections = ["## Unseen clients\n",
                "_Held out of training (federation.unseen_clients), tested with the last round's server state; not "
                "in the means above._\n"]
    if "global" in unseen:
        sections.append(markdown_table(f"Unseen clients: {unseen['split']} with the model a new client receives",
                                       unseen["global"], metrics))
    if "finetuned" in unseen:
        sections.append(markdown_table(f"Unseen clients: {unseen['split']} after {unseen['finetune_steps']} local "
                                       "fine-tuning steps", unseen["finetuned"], metrics))
    return sections


def evaluate_checkpoint(fed: Federation, split: str, ckpt_path: str | Path) -> dict[str, Any]:
    """Every client's ``split`` (``val`` or ``test``) with the checkpoint's state (and with the global model, and
    the unseen clients, as in :func:`report`); prints the tables."""
    per_client: dict[str, dict[str, float]] = {}
    global_per_client: dict[str, dict[str, float]] = {}
    clients = fed.evaluated_client_ids
    tasks = executor.evaluate_tasks(fed, fed.server_round, clients, (split,))
    for client_id, result in zip(clients, fed.executor.evaluate(fed, fed.server_round, tasks), strict=True):
        if result.metrics.get(split):
            per_client[client_id] = result.metrics[split]
        if result.metrics.get(f"{GLOBAL}/{split}"):
            global_per_client[client_id] = result.metrics[f"{GLOBAL}/{split}"]
    if not per_client:
        raise DataError(f"The data set has no {split!r} split to evaluate.")
    weights = {c: fed.datamodule.num_examples(c, split) for c in fed.client_ids}
    metric_names = list(fed.module.higher_is_better)
    result: dict[str, Any] = {"round": fed.server_round, "clients": per_client,
                              "summary": summarize(per_client, weights, fed.module.higher_is_better)}
    tables = [markdown_table(f"{split} of {ckpt_path}", result, metric_names)]
    if global_per_client:
        result[GLOBAL] = {"round": fed.server_round, "clients": global_per_client,
                          "summary": summarize(global_per_client, weights, fed.module.higher_is_better)}
        tables.append(markdown_table(f"{split} of {ckpt_path}, global model", result[GLOBAL], metric_names))
    unseen = evaluate_unseen(fed, split)
    if unseen is not None:
        result[UNSEEN] = unseen
        tables += _unseen_tables(unseen, metric_names)
    if fed.baseline_run is not None and split == "test":
        selection = "best" if Path(ckpt_path).name == BEST else "last"
        gain = baseline.gain_over_local(per_client, fed.server_round, selection, baseline.load(fed.baseline_run, fed),
                                        fed.module.higher_is_better)
        result[baseline.KEY] = gain
        tables.append(baseline.markdown(gain, metric_names))
    if fed.fabric.is_global_zero:
        print("\n".join(tables))
    return result


def report(fed: Federation) -> dict[str, Any]:
    """Print and save (Markdown, JSON, TensorBoard) the final per-client test results: of the personalized models,
    of the global model (when the strategy has one), of the unseen clients, and the gain over Local (with
    ``baseline_run``)."""
    weights = {c: fed.datamodule.num_examples(c, "test") for c in fed.client_ids}
    results = fed.history.results("test", weights)
    global_results = fed.history.results(f"{GLOBAL}/test", weights)
    if "last" in global_results:
        results[GLOBAL] = global_results
    unseen = evaluate_unseen(fed) if fed.history.last_round is not None else None
    if unseen is not None:
        results[UNSEEN] = unseen
    gain = None
    if fed.baseline_run is not None and ("best" in results or "last" in results):
        selection = "best" if "best" in results else "last"
        gain = baseline.gain_over_local(results[selection]["clients"], results[selection]["round"], selection,
                                        baseline.load(fed.baseline_run, fed), fed.module.higher_is_better)
        results[baseline.KEY] = gain
    results["comm"] = dict(fed.comm)
    results["checkpoints"] = record.checkpoints(fed)
    results.update(record.describe(fed))
    for callback in fed.callbacks:  # sections a callback adds (fedlit.privacy's ``privacy``), merged by key
        sections = getattr(callback, "results_json", None)
        for key, value in (sections(fed) if callable(sections) else {}).items():
            results.setdefault(key, {}).update(value)
    if fed.faults:
        results["faults"] = fed.faults
    if fed.stopped_early is not None:
        results["stopped_early"] = dict(fed.stopped_early)
    metrics = list(fed.module.higher_is_better)
    sections = [f"# Results: {fed.strategy!r}\n"]
    if "last" in results:
        sections.append(markdown_table("Test, last round", results["last"], metrics))
    if "best" in results:
        sections.append(markdown_table(
            f"Test at the best mean validation {fed.history.selection_metric}", results["best"], metrics))
    elif fed.history.best_round() is None:
        sections.append("_No validation split: the best-validation round is not defined (no best.ckpt)._\n")
    if GLOBAL in results:
        sections.append("## Global model\n\n_Each client with the server's global shared tensors and its own personal "
                        "tensors; the best round is the one chosen above._\n")
        for key, title in (("last", "Global model: test, last round"),
                           ("best", "Global model: test at the best mean validation "
                                    f"{fed.history.selection_metric}")):
            if key in results[GLOBAL]:
                sections.append(markdown_table(title, results[GLOBAL][key], metrics))
    if unseen is not None:
        sections += _unseen_tables(unseen, metrics)
    if gain is not None:
        sections.append(baseline.markdown(gain, metrics))
    sections.append(f"Communication: {fed.comm['upload_bytes']:,} bytes up, {fed.comm['download_bytes']:,} bytes "
                    f"down in training; {fed.comm.get('eval_download_bytes', 0):,} bytes down for evaluation.\n")
    if fed.stopped_early is not None:
        sections.append(f"Stopped after round {fed.stopped_early['round']} of {fed.rounds}: "
                        f"{fed.stopped_early['reason']}.\n")
    if fed.faults:
        lines = [f"- round {f['round']}, client {f['client']}: {f['kind']} ({f['detail']})" for f in fed.faults]
        sections.append("Clients left out of aggregation:\n\n" + "\n".join(lines) + "\n")
    text = "\n".join(sections)
    if fed.fabric.is_global_zero:  # over several ranks, every rank has the results and rank 0 writes them
        print(text)
        fed.out_dir.mkdir(parents=True, exist_ok=True)
        (fed.out_dir / "results.md").write_text(text)
        (fed.out_dir / "results.json").write_text(json.dumps(results, indent=1))
    final: dict[str, float] = {}
    for section, block in (("", results), (f"{GLOBAL}/", results.get(GLOBAL, {}))):
        for key, split_key in (("last", "test"), ("best", "test_at_best_val")):
            if key in block:
                for client_id, values in block[key]["clients"].items():
                    final.update({f"{section}client/{client_id}/{split_key}/{m}": v for m, v in values.items()})
                final.update({f"{section}server/{split_key}/{m}": v for m, v in block[key]["summary"].items()})
    if unseen is not None and fed.history.last_round is not None:
        unseen_log = unseen_scalars(fed, unseen)
        final.update(unseen_log)
        record.append_final(fed, fed.history.last_round, unseen_log)
    if gain is not None:
        final.update({f"{baseline.KEY}/{m}_{agg}": gain[agg][m] for agg in ("mean", "std") for m in gain[agg]})
    if final and fed.history.last_round is not None:
        fed.fabric.log_dict(final, step=fed.history.last_round)
        hparams.log(fed)
    for logger in fed.fabric.loggers:
        logger.finalize("success")
    return results
