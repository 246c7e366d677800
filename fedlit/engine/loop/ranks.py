"""Clients sharded over the ranks of a Fabric run (``federation.devices: N``, ``federation.num_nodes: M``).

A run over several devices or nodes starts one process per device (``fabric.launch()``: Fabric's own launcher
re-runs the command once per further local device; ``torchrun`` and SLURM's ``srun`` start the processes
themselves). Ranks do not split a client's batches as data-parallel training would: they split the *clients*.
The module is not wrapped in DDP (ranks train different clients, averaging their gradients would mix them); each
rank holds one live module on its device, the whole server state, and the store entries of its own clients.

Ownership (:func:`assign_clients`) is static and deterministic: every client of the data set belongs to one
rank, chosen by longest-processing-time-first greedy on the size of its train split (the largest client first,
each to the rank with the fewest training samples so far, the lower rank on a tie; clients of equal size keep
the data set's order), so every rank computes the same map without talking. A round then goes::

    every rank: select the clients, configure what the server sends each (the same on every rank)
    each rank: run the turns (or evaluations) of the selected clients it owns, in task order
    all ranks: all_gather_object the results (tensors moved to the CPU, and back to the device on arrival)
    every rank: the results in task order -> strategy.aggregate with identical inputs in identical order

so the server state stays identical on every rank without being broadcast, and a client's turn, seeded by
``(seed, round, client)``, is the same whatever rank runs it: the results do not depend on the number of ranks.

What travels between ranks each round: each turn's upload (shared tensors and extras, the bytes counted as
communication, exactly as in one process) and metrics, and each evaluation's metrics and validation picture.
What stays on its rank: the client's personal tensors, optimizer state and per-client strategy and callback
state (the :class:`~fedlit.core.store.ClientStore` entries), and its data. A checkpoint gathers every rank's store
entries to rank 0, which writes it (:func:`gather_store`); a resumed run, with any number of ranks, loads the
checkpoint on every rank and each keeps the entries of the clients it owns (:meth:`ClientStore.retain
<fedlit.core.store.ClientStore.retain>`).

Unseen clients (``federation.unseen_clients``) never train and hold only the store's initial template, which
every rank has: at the final test every rank evaluates (and fine-tunes, seeded by the client) them itself, with
the same result, and nothing travels. ``system/store_mb`` and ``system/peak_memory_mb`` are rank 0's (the store
of its own clients, the peak memory of its own process). Files, tables and the progress bar are rank 0's.

Failures: with ``federation.on_client_error: skip``, a failing turn's description travels like any other result
and every rank leaves the client out. With ``raise``, the rank whose client raised re-raises the error after
the gather and every other rank raises :class:`RankError` naming the client and the rank, so every process
ends.
"""

from __future__ import annotations

import contextlib
import heapq
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from fedlit.engine.loop.client import ClientTurn
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.executor import run_evaluate_task, run_fit_task
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask

if TYPE_CHECKING:
    from fedlit.engine.loop.run import Run

_STORE_PARTS = ("tensors", "optimizer", "extra")


class RankError(RuntimeError):
    """A client's turn or evaluation raised on another rank (its traceback is in that rank's output)."""


def assign_clients(client_ids: Sequence[str], sizes: Mapping[str, int], world_size: int) -> dict[int, list[str]]:
    """Which clients each of ``world_size`` ranks owns: longest-processing-time-first greedy on ``sizes`` (the
    largest client first, to the rank with the smallest total so far, the lower rank on a tie; clients of equal
    size in the order of ``client_ids``). Each rank's clients are listed in the order of ``client_ids``.

    Example: sizes 10, 7, 5, 3 over 2 ranks give rank 0 the clients of 10 and 3, rank 1 those of 7 and 5.
    """
    order = sorted(range(len(client_ids)), key=lambda i: (-sizes[client_ids[i]], i))
    loads = [(0, rank) for rank in range(world_size)]  # (samples so far, rank): the heap's smallest first
    owner: dict[str, int] = {}
    for i in order:
        load, rank = heapq.heappop(loads)
        owner[client_ids[i]] = rank
        heapq.heappush(loads, (load + sizes[client_ids[i]], rank))
    return {rank: [c for c in client_ids if owner[c] == rank] for rank in range(world_size)}


def launched_rank_zero() -> bool:
    """Whether this process is rank 0 as its launcher set it, before Fabric starts: ``RANK`` (torchrun), Fabric's
    own child processes (``LOCAL_RANK``, ``NODE_RANK``), SLURM's ``SLURM_PROCID``; True when none is set (the
    first process of Fabric's launcher). A guess good enough to decide who makes the run folder: every rank
    takes rank 0's folder after the launch."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"]) == 0
    if any(int(env.get(key) or 0) for key in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK")):
        return False
    if "LOCAL_RANK" in env:
        return True
    return int(env.get("SLURM_PROCID") or 0) == 0


class RankExecutor:
    """Each rank runs the tasks of the clients it owns; the results meet on every rank (module docstring)."""

    def __init__(self) -> None:
        #: Client -> the rank that owns it (set by :meth:`setup`).
        self.owner: dict[str, int] = {}

    def setup(self, run: Run) -> None:
        """Assign every client to a rank and drop the store entries of the others' clients (once; a later call
        does nothing)."""
        if self.owner:
            return
        sizes = {c: run.datamodule.num_examples(c, "train") for c in run.client_ids}
        shards = assign_clients(run.client_ids, sizes, run.fabric.world_size)
        self.owner = {c: rank for rank, clients in shards.items() for c in clients}
        run.store.retain(set(shards[run.fabric.global_rank]))
        for sub in run.module.modules():
            if hasattr(sub, "sync_on_compute"):  # torchmetrics would sum the states of the clients other ranks evaluate
                metric: Any = sub  # a torchmetrics Metric; _to_sync: the flag compute() reads, set at construction
                metric.sync_on_compute = metric._to_sync = False

    def fit(self, run: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn, in the order given (run by the task's owner)."""
        error = run.settings.on_client_error
        return self._run(run, server_round, tasks, lambda ctx, r, task: run_fit_task(ctx, r, task, error), "turn")

    def evaluate(self, run: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics, in the order given (measured by the task's owner)."""
        return self._run(run, server_round, tasks, run_evaluate_task, "evaluation")

    def teardown(self, run: Run) -> None:
        """Nothing to release: the process group ends with the processes."""

    def _run(
        self,
        run: Run,
        server_round: int,
        tasks: Sequence[Any],
        work: Callable[[ClientContext, int, Any], Any],
        what: str,
    ) -> list[Any]:
        rank = run.fabric.global_rank
        mine = [i for i, task in enumerate(tasks) if self.owner[task.client_id] == rank]
        done: dict[int, Any] = {}
        failure, error = None, None
        for n, i in enumerate(mine, 1):
            run.progress.client(f"client {tasks[i].client_id} ({n}/{len(mine)} on rank {rank})")
            try:
                done[i] = _pack(work(run.client_context(tasks[i].client_id), server_round, tasks[i]))
            except Exception as err:  # noqa: BLE001  (re-raised below, after the others know)
                error = err
                failure = (tasks[i].client_id, f"{type(err).__name__}: {err}")
                break
        gathered: list[Any] = [None] * run.fabric.world_size
        dist.all_gather_object(gathered, (done, failure))
        failed = [(r, part[1]) for r, part in enumerate(gathered) if part[1] is not None]
        if failed:
            if error is not None:
                raise error
            r, (client_id, detail) = failed[0]
            raise RankError(
                f"Round {server_round}: the {what} of client {client_id!r} raised on rank {r}: {detail} "
                f"(its traceback is in rank {r}'s output)."
            )
        results: dict[int, Any] = {}
        for part, _ in gathered:
            results.update(part)
        return [_unpack(results[i], run.fabric.device) for i in range(len(tasks))]


def gather_store(run: Run) -> dict[str, Any] | None:
    """Every rank's store entries, merged on rank 0 in the order of the clients (None on the other ranks); every
    rank must call it (it is a collective)."""
    state = run.store.state_dict()
    own = {part: _pack(state[part], cpu_only=True) for part in _STORE_PARTS}
    root = run.fabric.global_rank == 0
    gathered: list[Any] | None = [None] * run.fabric.world_size if root else None
    dist.gather_object(own, gathered, dst=0)
    if gathered is None:
        return None
    merged: dict[str, Any] = {"initial": state["initial"]}
    for part in _STORE_PARTS:
        entries = {c: v for shard in gathered for c, v in shard[part].items()}
        merged[part] = {
            c: entries[c] for c in [*run.client_ids, *sorted(set(entries) - set(run.client_ids))] if c in entries
        }
    return merged


@contextlib.contextmanager
def abort_on_error(run: Run) -> Iterator[None]:
    """On an error in the block, end the child processes that Fabric's own launcher started from this one (they
    would wait for this rank in their next collective); torchrun and SLURM end their processes themselves."""
    try:
        yield
    except BaseException:
        for proc in getattr(run.fabric.strategy.launcher, "procs", []) if run.fabric.world_size > 1 else []:
            if proc.poll() is None:
                proc.kill()
        raise


class _OnDevice:
    """A tensor that was on an accelerator, carried on the CPU; it goes back to the receiver's device."""

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


def _pack(obj: Any, cpu_only: bool = False) -> Any:
    """``obj`` with every tensor on the CPU (what ``all_gather_object`` can carry between ranks)."""

    def move(t: Tensor) -> Any:
        if t.device.type == "cpu":
            return t
        return t.detach().cpu() if cpu_only else _OnDevice(t.detach().cpu())

    return _map(obj, move)


def _unpack(obj: Any, device: torch.device) -> Any:
    return _map(obj, lambda t: t, lambda d: d.tensor.to(device))


def _map(obj: Any, on_tensor: Callable[[Tensor], Any], on_device: Callable[[_OnDevice], Any] | None = None) -> Any:
    if isinstance(obj, Tensor):
        return on_tensor(obj)
    if isinstance(obj, _OnDevice):
        return on_device(obj) if on_device is not None else obj
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: _map(getattr(obj, f.name), on_tensor, on_device) for f in fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: _map(v, on_tensor, on_device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map(v, on_tensor, on_device) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map(v, on_tensor, on_device) for v in obj)
    return obj
