"""One server round of :class:`~fedlit.federation.Federation` (selection, the clients' turns, quarantine,
aggregation, evaluation, logging, ``on_round_end``, ``best.ckpt`` and the checkpoint), and the tables printed once
at the start of a fit (class counts per client, tensors per role)."""

from __future__ import annotations

import resource
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from fedlit.core.checkpoint_io import LAST
from fedlit.core.errors import FedlitError, NonFiniteError
from fedlit.core.roles import role_summary_table
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine import energy, executor, record
from fedlit.engine import evaluate as evaluation

if TYPE_CHECKING:
    from fedlit.federation import Federation


def log_class_counts(fed: Federation) -> None:
    """Print the per-client class counts of the train split and log the full table to TensorBoard (only for
    a classification task)."""
    counts = fed.datamodule.class_counts()
    if counts is None:  # a task without classes (survival, regression): no class table
        return
    lines = ["| client | " + " | ".join(f"{s} per class" for s in ("train", "val", "test")) + " |",
             "|---|---|---|---|"]
    lines += [f"| {c} | " + " | ".join(str(v[s]) for s in ("train", "val", "test")) + " |"
              for c, v in counts.items()]
    table = "\n".join(lines)
    shown = lines[:2 + 12] + ([f"| ... {len(counts) - 12} more clients in class_counts.json |"]
                              if len(counts) > 12 else [])
    print(f"{len(counts)} clients, samples per class:\n" + "\n".join(shown), flush=True)
    _add_text(fed, "data/class_counts", table)

def log_role_summary(fed: Federation) -> None:
    """Print the tensors, parameters and MB of each role (after the strategy's refinement) and log the table
    to TensorBoard, once per fit."""
    rules = [*getattr(fed.module, "default_role_rules", list)(), *getattr(fed.module, "role_rules", [])]
    table = role_summary_table(fed.module, fed.module.parameter_roles(), rules)
    print(f"{type(fed.module).__name__} parameter roles ({fed.strategy!r}):\n{table}", flush=True)
    _add_text(fed, "model/roles", table)


def _add_text(fed: Federation, tag: str, table: str) -> None:
    """Log a Markdown table to the loggers that take text (TensorBoard)."""
    for logger in fed.fabric.loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            experiment.add_text(tag, table, global_step=fed.server_round)


def run_round(fed: Federation, server_round: int) -> None:
    start = time.perf_counter()
    fed.server_round = server_round
    fed.fabric.call("on_round_start", trainer=fed, pl_module=fed.module, server_round=server_round)
    generator = torch.Generator().manual_seed(fed.derive_seed("select", server_round))
    selected = fed.strategy.select_clients(server_round, fed.train_client_ids, fed._num_selected(), generator)
    updates, log, faults = [], {}, []
    upload = download = 0
    turns = fed.executor.fit(fed, server_round, executor.fit_tasks(fed, server_round, selected))
    for client_id, turn in zip(selected, turns, strict=True):
        if isinstance(turn, str):
            faults.append({"round": server_round, "client": client_id, "kind": "error", "detail": turn})
            continue
        update = turn.update
        upload += state_nbytes(update.state) + state_nbytes(update.extras)
        download += turn.download_bytes
        log[f"client/{client_id}/train/loss"] = update.metrics["loss"]
        if turn.problem is not None:
            kind = turn.problem_kind
            faults.append({"round": server_round, "client": client_id, "kind": kind, "detail": turn.problem})
            log[f"client/{client_id}/train/{'timed_out' if kind == 'timeout' else 'quarantined'}"] = 1.0
            continue
        updates.append(update)
    check_round(fed, server_round, selected, updates, faults)
    train_seconds = time.perf_counter() - start
    fed.fabric.call("on_before_aggregate", trainer=fed, pl_module=fed.module, server_round=server_round,
                     updates=updates)
    fed.strategy.aggregate(server_round, updates)
    # After the new server state, before evaluation: a callback may change it (ClientLevelDP's noise) and add
    # scalars to the round's log.
    fed.fabric.call("on_after_aggregate", trainer=fed, pl_module=fed.module, server_round=server_round, log=log)
    aggregate_seconds = time.perf_counter() - start - train_seconds
    fed.comm["upload_bytes"] += upload
    fed.comm["download_bytes"] += download
    losses = [u.metrics["loss"] for u in updates]
    if losses:
        log["server/train/loss_mean"] = sum(losses) / len(losses)
    log.update({"comm/upload_bytes": upload, "comm/download_bytes": download,
                "comm/upload_bytes_cumulative": fed.comm["upload_bytes"],
                "comm/download_bytes_cumulative": fed.comm["download_bytes"],
                "comm/clients": len(selected), "server/train/clients_left_out": len(faults)})
    metrics: dict[str, float] = {}
    if server_round % fed.eval_every == 0 or server_round == fed.rounds:
        eval_start = time.perf_counter()
        metrics = evaluation.evaluate_round(fed, server_round)
        log.update(metrics)
        log["system/eval_seconds"] = time.perf_counter() - eval_start
    log.update({"system/train_seconds": train_seconds, "system/aggregate_seconds": aggregate_seconds,
                "system/round_seconds": time.perf_counter() - start,
                "system/peak_memory_mb": _peak_memory_mb(fed.fabric.device),
                "system/store_mb": fed.store.nbytes() / 2**20,
                "system/trainable_parameters": fed.module.num_trainable_parameters()})
    kwh = energy.round_kwh(fed)
    if kwh is not None:  # measured only: no value where no counter can be read
        log["system/energy_kwh"] = kwh
    if fed.lr_schedule is not None:
        log["server/train/lr"] = fed.lr_schedule.learning_rates()[0]
        fed.lr_schedule.step()
    fed.fabric.log_dict(log, step=server_round)
    record.append_round(fed, server_round, log)
    fed.fabric.call("on_round_end", trainer=fed, pl_module=fed.module, server_round=server_round,
                     metrics=metrics)
    record.save_best(fed, server_round)  # before last.ckpt: a resume drops a best.ckpt newer than it
    if server_round % fed.checkpoint_every == 0 or server_round == fed.rounds or fed.should_stop:
        fed.save_checkpoint(fed.out_dir / "checkpoints" / LAST)

def check_round(fed: Federation, server_round: int, selected: list[str], updates: list[Any],
                 faults: list[dict[str, Any]]) -> None:
    """Warn about each left-out client; stop when too few updates remain (the last checkpoint is kept)."""
    fed.faults.extend(faults)
    for fault in faults:
        if fault["kind"] == "non-finite":
            warnings.warn(f"Round {server_round}: client {fault['client']!r} is quarantined, its update is left "
                          f"out of aggregation ({fault['detail']}).", stacklevel=3)
        elif fault["kind"] == "timeout":
            warnings.warn(f"Round {server_round}: client {fault['client']!r} timed out, its update is left out of "
                          f"aggregation and its stored state is unchanged ({fault['detail']}).", stacklevel=3)
    if len(updates) >= min(fed.min_clients, len(selected)):
        return
    checkpoint = fed.out_dir / "checkpoints" / LAST
    kept = (f"the last good checkpoint {checkpoint} is kept"
            if checkpoint.is_file() else "no checkpoint was written yet")
    detail = "; ".join(f"{f['client']}: {f['detail']}" for f in faults[:4])
    if faults and all(f["kind"] == "non-finite" for f in faults) and not updates:
        raise NonFiniteError(
            f"Round {server_round}: every client's update is non-finite ({detail}); nothing is aggregated and "
            f"no result is published; {kept}. The local training diverged: lower model.init_args.lr, or check "
            "the inputs for NaN/Inf.")
    raise FedlitError(
        f"Round {server_round}: only {len(updates)} of {len(selected)} clients gave a usable update "
        f"(federation.min_clients={fed.min_clients}; {detail}); {kept}.")


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
