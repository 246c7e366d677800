"""One server round of a run (selection, the clients' turns, quarantine,
aggregation, evaluation, logging, ``on_round_end``, ``best.ckpt`` and the checkpoint), and the tables printed once
at the start of a fit (class counts per client, tensors per role)."""

from __future__ import annotations

import resource
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from fedlit.core.checkpoint_io import LAST, last_good_checkpoint
from fedlit.core.errors import FedlitError, NonFiniteError, broken
from fedlit.core.names import table_cell
from fedlit.core.roles import role_summary_table
from fedlit.core.tensors import nbytes as state_nbytes
from fedlit.engine.loop import aggregation, divergence, placement, resume
from fedlit.engine.loop import evaluate as evaluation
from fedlit.engine.loop.screening import non_finite_server_state, screen_round, screen_update
from fedlit.engine.loop.tasks import fit_tasks
from fedlit.engine.records import energy, record

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run


def log_class_counts(run: Run) -> None:
    """Print the per-client class counts of the train split and log the full table to TensorBoard (only for
    a classification task)."""
    counts = run.datamodule.class_counts()
    if counts is None:  # a task without classes (survival, regression): no class table
        return
    lines = ["| client | " + " | ".join(f"{s} per class" for s in ("train", "val", "test")) + " |", "|---|---|---|---|"]
    lines += [
        f"| {table_cell(c)} | " + " | ".join(str(v[s]) for s in ("train", "val", "test")) + " |"
        for c, v in counts.items()
    ]
    table = "\n".join(lines)
    shown = lines[: 2 + 12] + (
        [f"| ... {len(counts) - 12} more clients in class_counts.json |"] if len(counts) > 12 else []
    )
    print(f"{len(counts)} clients, samples per class:\n" + "\n".join(shown), flush=True)
    _add_text(run, "data/class_counts", table)


def log_role_summary(run: Run) -> None:
    """Print the tensors, parameters and MB of each role (after the strategy's refinement) and log the table
    to TensorBoard, once per fit. Below it: the recipe's role rules (``model.init_args.roles``) that match no
    tensor; a module's own defaults are left out (``backbone.*`` over an ``Identity`` backbone matches nothing, and
    says nothing about the recipe)."""
    table = role_summary_table(run.module, run.module.parameter_roles(), list(getattr(run.module, "role_rules", [])))
    print(f"{type(run.module).__name__} parameter roles ({run.strategy!r}):\n{table}", flush=True)
    _add_text(run, "model/roles", table)


def _add_text(run: Run, tag: str, table: str) -> None:
    """Log a Markdown table to the loggers that take text (TensorBoard)."""
    for logger in run.fabric.loggers:
        experiment: Any = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            experiment.add_text(tag, table, global_step=run.state.round)


def run_round(run: Run, server_round: int) -> None:
    start = time.perf_counter()
    run.state.round = server_round
    log: dict[str, float] = {}
    server = run.server_context(log)  # what the round's hooks receive as trainer: a read-only view, and the log
    run.hooks.call("on_round_start", trainer=server, pl_module=run.module, server_round=server_round)
    generator = torch.Generator().manual_seed(run.derive_seed("select", server_round))
    selected = run.strategy.select_clients(server_round, run.train_client_ids, run.num_selected(), generator)
    updates, faults, sent, sizes = [], [], [], {}
    upload = download = 0
    # an update over max_update_norm is clipped by screen_round under update_norm_action: clip, else rejected here
    bounds = (run.settings.max_update_norm if run.settings.update_norm_action == "reject" else None,)
    tasks = fit_tasks(run.strategy, server_round, selected)
    if not (run.executor is not None):  # chosen by setup
        raise broken("the executor is chosen when the run is set up")
    turns = run.executor.fit(run, server_round, tasks)
    for task, turn in zip(tasks, turns, strict=True):
        client_id = task.client_id
        if isinstance(turn, str):
            faults.append({"round": server_round, "client": client_id, "kind": "error", "detail": turn})
            continue
        update = turn.update
        sizes[client_id] = update.num_examples
        upload += state_nbytes(update.state) + state_nbytes(update.extras)
        download += turn.download_bytes
        log[f"client/{client_id}/train/loss"] = update.metrics["loss"]
        problem = (
            (turn.problem_kind, turn.problem)
            if turn.problem is not None
            else screen_update(update, task.received, *bounds, run.settings.max_update_ratio)
        )
        if problem is not None:
            kind, detail = problem
            faults.append({"round": server_round, "client": client_id, "kind": kind, "detail": detail})
            log[f"client/{client_id}/train/{_FAULT_TAGS.get(kind, 'quarantined')}"] = 1.0
            continue
        updates.append(update)
        sent.append(task.received)
    run.state.train_sizes[str(server_round)] = sizes  # the weights the clients claimed: results.json's train_sizes
    updates = _screen_round(run, server_round, selected, updates, sent, faults, log)
    check_round(run, server_round, selected, updates, faults)
    train_seconds = time.perf_counter() - start
    run.hooks.call(
        "on_before_aggregate", trainer=server, pl_module=run.module, server_round=server_round, updates=updates
    )
    aggregation.aggregate(run.strategy, server_round, updates)  # stores what aggregate returns as global_state
    # After the new server state, before evaluation: a callback may change it (ClientLevelDP's noise) and add
    # scalars to the round's log.
    run.hooks.call("on_after_aggregate", trainer=server, pl_module=run.module, server_round=server_round, log=log)
    _check_aggregate(run, server_round)
    aggregate_seconds = time.perf_counter() - start - train_seconds
    run.state.comm["upload_bytes"] += upload
    run.state.comm["download_bytes"] += download
    losses = [u.metrics["loss"] for u in updates]
    if losses:
        log["server/train/loss_mean"] = sum(losses) / len(losses)
    divergence.check(run, server_round, log.get("server/train/loss_mean"))  # may stop before the round is saved
    log.update(
        {
            "comm/upload_bytes": upload,
            "comm/download_bytes": download,
            "comm/upload_bytes_cumulative": run.state.comm["upload_bytes"],
            "comm/download_bytes_cumulative": run.state.comm["download_bytes"],
            "comm/clients": len(selected),
            "server/train/clients_left_out": len(faults),
        }
    )
    metrics: dict[str, float] = {}
    if server_round % run.settings.eval_every == 0 or server_round == run.settings.rounds:
        eval_start = time.perf_counter()
        metrics = evaluation.evaluate_round(run, server_round)
        log.update(metrics)
        log["system/eval_seconds"] = time.perf_counter() - eval_start
    log.update(
        {
            "system/train_seconds": train_seconds,
            "system/aggregate_seconds": aggregate_seconds,
            "system/round_seconds": time.perf_counter() - start,
            "system/peak_memory_mb": _peak_memory_mb(run.fabric.device),
            "system/store_mb": run.store.nbytes() / 2**20,
            "system/trainable_parameters": run.module.num_trainable_parameters(),
        }
    )
    kwh = energy.round_kwh(run)
    if kwh is not None:  # measured only: no value where no counter can be read
        log["system/energy_kwh"] = kwh
    if run.lr_schedule is not None:
        log["server/train/lr"] = run.lr_schedule.learning_rates()[0]
        run.lr_schedule.step()
    run.fabric.log_dict(log, step=server_round)
    record.append_round(run, server_round, log)
    run.hooks.call("on_round_end", trainer=server, pl_module=run.module, server_round=server_round, metrics=metrics)
    placement.place_server_state(run.strategy, run.store.device)  # the rule a resume follows too
    paths = []
    if record.is_best(run, server_round):  # before last.ckpt: a resume drops a best.ckpt newer than it
        paths.append(record.best_path(run))
    settings = run.settings
    if server_round % settings.checkpoint_every == 0 or server_round == settings.rounds or run.state.should_stop:
        paths.append(run.out_dir / "checkpoints" / LAST)
        run.state.checkpointed = server_round
    if paths:  # one copy of the state, written in order by the writer thread while the next round runs
        resume.save(run, *paths, background=True)


#: The tag of a left-out (or clipped) turn in the round's log, by the kind of its fault.
_FAULT_TAGS = {"timeout": "timed_out", "rejected": "rejected", "non-finite": "quarantined", "clipped": "clipped"}


def _screen_round(
    run: Run,
    server_round: int,
    selected: list[str],
    updates: list[Any],
    sent: list[Any],
    faults: list[dict[str, Any]],
    log: dict[str, float],
) -> list[Any]:
    """The updates that stay in the round after :func:`~fedlit.engine.loop.screening.screen_round` (the clients'
    weights against ``max_client_weight``, the norms against ``max_update_norm_vs_median``); each rejected or clipped
    one recorded in ``faults`` and tagged in ``log``."""
    sizes = {c: run.num_examples(c, "train") for c in selected}
    kept = []
    for update, problem in zip(updates, screen_round(updates, sent, sizes, run.settings), strict=True):
        if problem is not None:
            faults.append({"round": server_round, "client": update.client_id, "kind": problem[0], "detail": problem[1]})
            log[f"client/{update.client_id}/train/{_FAULT_TAGS[problem[0]]}"] = 1.0
        if problem is None or problem[0] == "clipped":
            kept.append(update)
    return kept


def _check_aggregate(run: Run, server_round: int) -> None:
    """Refuse to commit a round whose aggregated server state is not finite (nothing of it logged or saved)."""
    bad = non_finite_server_state(run.strategy.state_dict())
    if bad is None:
        return
    kept = last_good_checkpoint(run.out_dir)
    raise NonFiniteError(
        f"Round {server_round}: the aggregate of the clients' updates is not finite ({bad}); the round is not "
        f"published, evaluated or saved; {kept}. Leave out poisoned updates with federation.max_update_norm or a "
        "lower federation.max_update_ratio (or a robust aggregator such as strategy.init_args.aggregator: median), "
        "or lower model.init_args.lr, then resume."
    )


def check_round(
    run: Run, server_round: int, selected: list[str], updates: list[Any], faults: list[dict[str, Any]]
) -> None:
    """Warn about each left-out client; stop when too few updates remain (the last checkpoint is kept)."""
    run.state.faults.extend(faults)
    for fault in faults:
        if fault["kind"] == "non-finite":
            warnings.warn(
                f"Round {server_round}: client {fault['client']!r} is quarantined, its update is left "
                f"out of aggregation ({fault['detail']}).",
                stacklevel=3,
            )
        elif fault["kind"] == "rejected":
            warnings.warn(
                f"Round {server_round}: client {fault['client']!r}'s update is rejected and left out of "
                f"aggregation ({fault['detail']}).",
                stacklevel=3,
            )
        elif fault["kind"] == "clipped":
            warnings.warn(
                f"Round {server_round}: client {fault['client']!r}'s update is scaled down to a norm bound and "
                f"aggregated ({fault['detail']}).",
                stacklevel=3,
            )
        elif fault["kind"] == "timeout":
            warnings.warn(
                f"Round {server_round}: client {fault['client']!r} timed out, its update is left out of "
                f"aggregation and its stored state is unchanged ({fault['detail']}).",
                stacklevel=3,
            )
    if len(updates) >= min(run.settings.min_clients, len(selected)):
        return
    kept = last_good_checkpoint(run.out_dir)
    detail = "; ".join(f"{f['client']}: {f['detail']}" for f in faults[:4])
    if faults and all(f["kind"] in ("non-finite", "rejected") for f in faults) and not updates:
        raise NonFiniteError(
            f"Round {server_round}: every client's update is non-finite or rejected ({detail}); nothing is "
            f"aggregated and no result is published; {kept}. The local training diverged: lower "
            "model.init_args.lr, or check the inputs for NaN/Inf."
        )
    raise FedlitError(
        f"Round {server_round}: only {len(updates)} of {len(selected)} clients gave a usable update "
        f"(federation.min_clients={run.settings.min_clients}; {detail}); {kept}."
    )


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
