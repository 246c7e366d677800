"""A run from start to end: set-up (data, roles, the live module, the store, the strategy, a resume), the rounds,
the report; and the evaluation of a checkpoint.

::

    set up; print the per-client class counts and the tensors, parameters and MB per role; on_fit_start
    for server_round in 1..R:
        on_round_start
        clients = strategy.select_clients(server_round, client_ids, num_clients, generator)   # seeded
        each client's turn (fedlit.engine.loop.client) through the executor, in task order
        quarantine non-finite updates, leave out turns past client_timeout (and, with on_client_error=skip,
        clients that raised)
        on_before_aggregate; strategy.global_state = strategy.aggregate(server_round, updates) (checked: the
        declared names and shapes); on_after_aggregate
        evaluation (validation and test, per client), logging
        on_round_end; best.ckpt; checkpoint; stop here if a hook called trainer.request_stop (EarlyStopping)
    report; on_fit_end

Each client's local training re-seeds the global and data-loader RNGs from ``(seed, round, client)``, so a run does
not depend on client order and a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fedlit.core.checkpoint_io import load_checkpoint, wait_for_writes
from fedlit.core.errors import ConfigError, broken
from fedlit.core.names import check_client_ids
from fedlit.data.common.workers import close_workers
from fedlit.engine.loop import placement, ranks, results, resume, rounds
from fedlit.engine.loop.channels import channel_problem
from fedlit.engine.loop.executor import LocalExecutor
from fedlit.engine.loop.optim import round_schedule
from fedlit.engine.loop.results import evaluate_checkpoint
from fedlit.engine.loop.run import Run
from fedlit.engine.records import baseline, energy, record
from fedlit.engine.records.progress import Progress
from fedlit.engine.records.run_folder import claim_run_dir


def launch(run: Run) -> None:
    """Start the run's processes when it spans several devices or nodes (``fabric.launch()``: Fabric's own
    launcher re-runs this command once per further local device, torchrun and SLURM start them themselves);
    nothing for one process, or once launched."""
    if run.fabric.world_size > 1 and not run.launched:
        run.fabric.launch()
        run.launched = True


def setup(run: Run, ckpt_path: str | Path | None = None, *, resuming: bool = False) -> None:
    """Prepare data, roles, the live module, the store and the strategy; resume from ``ckpt_path``.

    Only the first call builds; a later one (``evaluate`` after ``fit``) only loads ``ckpt_path`` if given.
    ``resuming``: a fit continues from ``ckpt_path`` (not an evaluation), so it may not drop a callback that reported
    on the run (:func:`fedlit.engine.loop.resume.check_dropped`).
    """
    if run.wrapped is not None:
        if ckpt_path is not None:
            resume.restore(run, load_checkpoint(ckpt_path), ckpt_path, resuming=resuming)
        return
    launch(run)
    if run.settings.threads is not None:  # after the launch: Lightning sets each launched process's own count
        torch.set_num_threads(run.settings.threads)
    run.datamodule.setup()
    # a FederatedDataModule checked its ids in setup(); any other data source (a Flower server's nodes) here
    check_client_ids(run.client_ids, f"{type(run.datamodule).__name__}.client_ids")
    check_compatible(run)
    roles = run.strategy.configure_roles(run.module.parameter_roles())
    run.module.set_parameter_roles(roles)
    if not any(p.requires_grad for p in run.module.parameters()):
        raise ConfigError(
            "Nothing to train: every parameter is frozen. Give a role rule that makes some tensors `shared` or "
            "`personal` (model.init_args.roles)."
        )
    if not roles.names("shared") and run.strategy.communicates:
        warnings.warn(f"{run.strategy!r} shares no tensor: every client will train alone.", stacklevel=3)
    if run.fabric.world_size == 1:
        run.wrapped = run.fabric.setup_module(run.module)
    else:  # ranks train different clients: no DDP wrapper, whose backward would average their gradients
        run.wrapped = run.fabric.strategy.precision.convert_module(run.module).to(run.fabric.device)
    chosen = run.executor is not None
    for speedup in run.speedups:  # the feature cache and fused clients (fedlit.engine.speedups)
        speedup.configure(run)
    if run.executor is None:
        run.executor = ranks.RankExecutor() if run.fabric.world_size > 1 else LocalExecutor()
    if not chosen:
        run.executor.setup(run)  # before a resume fills the store: each rank keeps its own clients only
    for speedup in run.speedups:  # evaluation reuse, which needs the executor
        speedup.attach(run)
    run.lr_schedule = round_schedule(run.module)
    run.state.identity = resume.identity(run)
    # where state lives (fedlit.engine.loop.placement): the store and the server on store_device, pinned host memory
    # between a CUDA device and a CPU store
    run.store.pin_memory = run.fabric.device.type == "cuda" and run.store.device.type == "cpu"
    run.store.set_initial(run.module.named_tensors("personal"))
    counts = run.datamodule.class_counts()  # None for a task without classes
    training = run.train_client_ids
    run.strategy.initialize(
        placement.server_inputs(run.module.named_tensors("shared"), run.store.device),
        training,
        None if counts is None else {c: counts[c]["train"] for c in training},
        roles=roles,
    )
    placement.place_server_state(run.strategy, run.store.device)
    if ckpt_path is not None:
        dropped = resume.restore(run, load_checkpoint(ckpt_path), ckpt_path, resuming=resuming)
        resume.record_resume(run, run.out_dir, dropped)
        run.state.checkpointed = run.state.round
        if resuming and run.fabric.is_global_zero:
            resume.check_run_files(run, ckpt_path)
    run.executor.setup(run)


def check_compatible(run: Run) -> None:
    """Refuse a model, strategy and data that do not fit, naming every problem."""
    task = getattr(run.datamodule, "task", None)
    problems = [
        f"{section} {type(obj).__name__} accepts tasks {sorted(accepted)} but data "
        f"{type(run.datamodule).__name__} has task {task!r}"
        for section, obj in (("model", run.module), ("strategy", run.strategy))
        if task is not None and (accepted := getattr(obj, "accepted_tasks", None)) is not None and task not in accepted
    ]
    for attr in ("task", "num_classes") if not problems else ():
        ours, theirs = getattr(run.module, attr, None), getattr(run.datamodule, attr, None)
        if ours is not None and theirs is not None and ours != theirs:
            problems.append(f"model.init_args.{attr}={ours!r} but the data set has {attr}={theirs!r}")
    problems += _unseen_problems(run)
    if (channels := channel_problem(run)) is not None:
        problems.append(channels)
    count = run.num_selected()
    if isinstance(run.settings.clients_per_round, int) and count > len(run.train_client_ids):
        problems.append(
            f"federation.clients_per_round={count} but the data has only {len(run.train_client_ids)} clients that train"
        )
    problems += _min_clients_problems(run, count)
    if problems:
        raise ConfigError("Model, strategy and data do not fit: " + "; ".join(problems) + ".")


def _min_clients_problems(run: Run, count: int) -> list[str]:
    """``federation.min_clients`` that no round could reach: more than the clients that train, or than a round
    selects."""
    least, training = run.settings.min_clients, len(run.train_client_ids)
    if least > training:
        return [
            f"federation.min_clients={least} but the data has only {training} clients that train; "
            f"lower federation.min_clients to at most {training}"
        ]
    if least > count:
        return [
            f"federation.min_clients={least} but a round selects only {count} clients "
            f"(federation.clients_per_round={run.settings.clients_per_round}): no round could aggregate; "
            f"lower federation.min_clients or raise federation.clients_per_round"
        ]
    return []


def _unseen_problems(run: Run) -> list[str]:
    unseen = run.settings.unseen_clients
    if not unseen:
        return []
    trainable, client_ids = list(run.datamodule.train_client_ids), run.client_ids
    if isinstance(unseen, int):
        if unseen >= len(trainable):
            return [
                f"federation.unseen_clients={unseen} holds out every client that trains (the data "
                f"has {len(trainable)}); hold out fewer"
            ]
        return []
    problems = []
    unknown = [c for c in unseen if c not in client_ids]
    if unknown:
        problems.append(
            f"federation.unseen_clients: {unknown} are not clients of the data set (its clients: "
            f"{client_ids[:10]}{' ...' if len(client_ids) > 10 else ''})"
        )
    evaluation_only = [c for c in unseen if c in client_ids and c not in trainable]
    if evaluation_only:
        problems.append(
            f"federation.unseen_clients: {evaluation_only} are already evaluation-only in the data "
            "set (evaluated every round with what a new client receives); leave them out of the list"
        )
    if not set(trainable) - set(unseen):
        problems.append(f"federation.unseen_clients={unseen} holds out every client that trains")
    return problems


def fit(run: Run, ckpt_path: str | Path | None = None) -> dict[str, Any]:
    """Run the remaining rounds (all of them, or those after ``ckpt_path``) and return the test results.

    The run holds ``out_dir`` (see :mod:`fedlit.engine.records.run_folder`) from start to end: a fresh fit refuses a
    folder that already holds a run, and any fit refuses a folder that another live run holds.
    """
    launch(run)
    zero = run.fabric.is_global_zero  # rank 0 holds the folder and writes the files, the others write nothing
    # On an error, end the processes this one launched: they would wait for it in their next collective.
    with (
        ranks.abort_on_error(run),
        claim_run_dir(run.out_dir, resume=ckpt_path is not None) if zero else contextlib.nullcontext(),
        matmul_precision(run),
    ):
        setup(run, ckpt_path, resuming=True)
        if run.baseline_run is not None:  # refuse another data set or seed before training, not after
            baseline.load(run.baseline_run, run)
        record.begin(run, resumed=ckpt_path is not None)
        if zero and ckpt_path is not None and run.state.round >= run.settings.rounds:
            where = "already past" if run.state.round > run.settings.rounds else "at"
            print(
                f"Note: {ckpt_path} is of round {run.state.round}, {where} federation.rounds={run.settings.rounds}: "
                f"no round is run, and its results are reported again. To train on, resume with --federation.rounds "
                f"above {run.state.round}.",
                flush=True,
            )
        if zero:
            resume.save_config(run)
            rounds.log_class_counts(run)
            rounds.log_role_summary(run)
        run.hooks.call("on_fit_start", trainer=run.server_context(), pl_module=run.module)
        run.progress = Progress(run.settings.progress_bar and zero)
        try:
            for server_round in run.progress.rounds(run.state.round + 1, run.settings.rounds):
                if run.state.should_stop:
                    break
                rounds.run_round(run, server_round)
            wait_for_writes()  # the last checkpoint on disk (or its error raised) before the run reports
            run.progress.close()
            state = run.state
            if state.should_stop and state.round < run.settings.rounds:
                state.stopped_early = {"round": state.round, "reason": state.stop_reason or "a callback stopped"}
                if zero:
                    print(
                        f"Stopped after round {state.round} of {run.settings.rounds}: {state.stopped_early['reason']}.",
                        flush=True,
                    )
            out = results.report(run)
        finally:
            wait_for_writes(raise_error=False)  # ending on an error of its own: its last checkpoint written anyway
            if not (run.executor is not None):  # chosen by setup
                raise broken("the executor is chosen when the run is set up")
            run.executor.teardown(run)
            close_workers(run.datamodule)  # the DataLoader workers its loaders shared end with the run
        energy.stop(run)
        run.hooks.call("on_fit_end", trainer=run.server_context(), pl_module=run.module)
    return out


def evaluate(run: Run, split: str, ckpt_path: str | Path) -> dict[str, Any]:
    """Evaluate the checkpoint's state on every client's ``split`` (``val`` or ``test``); print the table."""
    with matmul_precision(run):
        setup(run, ckpt_path)
        result = evaluate_checkpoint(run, split, ckpt_path)
    record.write_evaluation(run, split, ckpt_path, result)
    return result


@contextlib.contextmanager
def matmul_precision(run: Run) -> Iterator[None]:
    """``federation.matmul_precision`` (``torch.set_float32_matmul_precision``) while the run computes, the process's
    own setting restored after it; None leaves the process's setting alone."""
    chosen, before = run.settings.matmul_precision, torch.get_float32_matmul_precision()
    if chosen is None:
        yield
        return
    torch.set_float32_matmul_precision(chosen)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
