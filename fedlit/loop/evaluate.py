"""The evaluation phase: every client's model on its own validation and test splits, and the final report.

Each evaluated client downloads what :meth:`~fedlit.strategies.base.Strategy.configure_evaluate` gives it (once per
evaluated round, for both splits); those bytes are counted as ``comm/eval_download_bytes``, beside the training
traffic. Then ``on_client_evaluate_start`` lets a strategy put a model the client holds into the live module (a
personal model kept in its ``client_state``). Validation metrics are logged per round; test metrics are recorded
for the final report only (nothing is chosen or shown per round on test). A module whose ``validation_images()``
draws its validation examples (segmentation) has that picture logged per client and round, to the loggers that
take images (TensorBoard).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedlit.errors import DataError
from fedlit.evaluation import markdown_table, summarize
from fedlit.loop import hparams, record
from fedlit.loop.local import call_with_client_state, load_client
from fedlit.strategies.functional import state_nbytes

if TYPE_CHECKING:
    from fedlit.federation import Federation

SPLITS = ("val", "test")


def evaluate_client(fed: Federation, server_round: int, client_id: str, splits: tuple[str, ...] = SPLITS,
                    images: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, dict[str, float]], int]:
    """``client_id``'s metrics on each of ``splits`` that it has (personal tensors + what the strategy gives it),
    and the bytes it downloaded for that (0 when it has none of the splits). With ``images`` given, the module's
    ``validation_images()`` after the validation split, if any, is put there under ``client_id``."""
    loaders = {s: fed.datamodule.val_dataloader(client_id) if s == "val" else fed.datamodule.test_dataloader(client_id)
               for s in splits}
    loaders = {s: loader for s, loader in loaders.items() if loader is not None}
    if not loaders:
        return {}, 0
    received = fed.strategy.configure_evaluate(server_round, client_id)
    load_client(fed, client_id, received)
    call_with_client_state(fed, "on_client_evaluate_start", trainer=fed, pl_module=fed.module,
                           server_round=server_round, client_id=client_id)
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
    return metrics, state_nbytes(received)


def evaluate_round(fed: Federation, server_round: int) -> dict[str, float]:
    """Evaluate every client, record the round in the history; the validation scalars to log."""
    per_split: dict[str, dict[str, dict[str, float]]] = {s: {} for s in SPLITS}
    download = 0
    images: dict[str, torch.Tensor] | None = {} if record.image_writers(fed) else None
    for client_id in fed.client_ids:
        metrics, received = evaluate_client(fed, server_round, client_id, images=images)
        download += received
        for split, values in metrics.items():
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
        if split == "test":
            continue
        weights = {c: fed.datamodule.num_examples(c, split) for c in per_client}
        for client_id, values in per_client.items():
            log.update({f"client/{client_id}/{split}/{m}": v for m, v in values.items()})
        summary = summarize(per_client, weights, fed.module.higher_is_better)
        log.update({f"server/{split}/{k}": v for k, v in summary.items()})
    return log


def evaluate_checkpoint(fed: Federation, split: str, ckpt_path: str | Path) -> dict[str, Any]:
    """Every client's ``split`` (``val`` or ``test``) with the checkpoint's state; prints the table."""
    per_client = {}
    for client_id in fed.client_ids:
        metrics, _ = evaluate_client(fed, fed.server_round, client_id, (split,))
        if metrics.get(split):
            per_client[client_id] = metrics[split]
    if not per_client:
        raise DataError(f"The data set has no {split!r} split to evaluate.")
    weights = {c: fed.datamodule.num_examples(c, split) for c in per_client}
    result = {"round": fed.server_round, "clients": per_client,
              "summary": summarize(per_client, weights, fed.module.higher_is_better)}
    print(markdown_table(f"{split} of {ckpt_path}", result, list(fed.module.higher_is_better)))
    return result


def report(fed: Federation) -> dict[str, Any]:
    """Print and save (Markdown, JSON, TensorBoard) the final per-client test results."""
    weights = {c: fed.datamodule.num_examples(c, "test") for c in fed.client_ids}
    results = fed.history.results("test", weights)
    results["comm"] = dict(fed.comm)
    results["checkpoints"] = record.checkpoints(fed)
    results.update(record.describe(fed))
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
    sections.append(f"Communication: {fed.comm['upload_bytes']:,} bytes up, {fed.comm['download_bytes']:,} bytes "
                    f"down in training; {fed.comm.get('eval_download_bytes', 0):,} bytes down for evaluation.\n")
    if fed.stopped_early is not None:
        sections.append(f"Stopped after round {fed.stopped_early['round']} of {fed.rounds}: "
                        f"{fed.stopped_early['reason']}.\n")
    if fed.faults:
        lines = [f"- round {f['round']}, client {f['client']}: {f['kind']} ({f['detail']})" for f in fed.faults]
        sections.append("Clients left out of aggregation:\n\n" + "\n".join(lines) + "\n")
    text = "\n".join(sections)
    print(text)
    fed.out_dir.mkdir(parents=True, exist_ok=True)
    (fed.out_dir / "results.md").write_text(text)
    (fed.out_dir / "results.json").write_text(json.dumps(results, indent=1))
    final: dict[str, float] = {}
    for key, split_key in (("last", "test"), ("best", "test_at_best_val")):
        if key in results:
            for client_id, values in results[key]["clients"].items():
                final.update({f"client/{client_id}/{split_key}/{m}": v for m, v in values.items()})
            final.update({f"server/{split_key}/{m}": v for m, v in results[key]["summary"].items()})
    if final and fed.history.last_round is not None:
        fed.fabric.log_dict(final, step=fed.history.last_round)
        hparams.log(fed)
    for logger in fed.fabric.loggers:
        logger.finalize("success")
    return results
