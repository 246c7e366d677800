"""A run's progress in one place (:class:`RunState`), and what the records read of a run (:class:`RecordedRun`).

:class:`RunState` holds exactly what changes as a run goes and what its checkpoints save of it
(:func:`fedlit.engine.loop.resume.save` and ``restore``): the round, the evaluation history, the communication and
compute totals, the faults, the run's identity, the callbacks dropped on a resume, the timing, and whether (and why)
a callback stopped the run. The loop's :class:`~fedlit.engine.loop.run.Run` holds one as ``run.state``, beside its
services (Fabric, the client store, the executor, the hooks).

The records (this package) write what a run leaves behind and sit below the loop: they never import it. They
read a run through :class:`RecordedRun`, the part of it they use, which the loop's ``Run`` satisfies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedlit.engine.records.history import EvaluationHistory

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fedlit.module import FederatedModule
    from fedlit.strategies.base import Strategy


def _comm() -> dict[str, int]:
    return {"upload_bytes": 0, "download_bytes": 0, "eval_download_bytes": 0}


def _compute() -> dict[str, int]:
    return {"eval_finetune_steps": 0}


@dataclass
class RunState:
    """What a run has done so far (see the module docstring).

    Args:
        history: Every evaluated round's per-client metrics, and the selection of the best round.
        round: The last finished server round (0 before the first; rounds count from 1).
        comm: Bytes sent so far: ``upload_bytes`` and ``download_bytes`` in training, ``eval_download_bytes`` to
            evaluate.
        compute: Work beside the clients' turns: ``eval_finetune_steps``, the local steps taken before evaluations.
        faults: The clients left out of aggregation (``round``, ``client``, ``kind``, ``detail``), and those whose
            update was clipped to a norm bound (kind ``clipped``).
        train_sizes: Per round (its number as a string), the ``num_examples`` each client's update claimed (its
            weight; in a deployment, the train size its node declared when the run started); in ``results.json``.
        identity: What a resumed run must share with the checkpoint (:func:`fedlit.engine.loop.resume.identity`);
            empty until the run is set up.
        dropped_callbacks: Callbacks that reported on the run and were dropped on a resume
            (``federation.allow_dropped_callbacks``): ``state_key`` -> the round after which, their last state
            and report.
        timing: The run's first start, its wall time and energy so far (:mod:`fedlit.engine.records.record`).
        should_stop: Set by a callback (e.g. :class:`~fedlit.callbacks.EarlyStopping`) to end the run after this
            round.
        stop_reason: Why, as the callback says it.
        stopped_early: ``{"round", "reason"}`` once the run has stopped before ``federation.rounds``; in
            ``results.json``.
        divergence: The reference of :mod:`fedlit.engine.loop.divergence`: the first round's ``round`` and mean
            training ``loss`` (kept in the checkpoint), and ``warned`` once it has warned.
        checkpointed: The round of the last ``checkpoints/last.ckpt`` this process wrote or resumed from (None:
            none yet), for the line an interrupted fit prints.
    """

    history: EvaluationHistory
    round: int = 0
    comm: dict[str, int] = field(default_factory=_comm)
    compute: dict[str, int] = field(default_factory=_compute)
    faults: list[dict[str, Any]] = field(default_factory=list)
    train_sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    dropped_callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    should_stop: bool = False
    stop_reason: str | None = None
    stopped_early: dict[str, Any] | None = None
    divergence: dict[str, Any] = field(default_factory=dict)
    checkpointed: int | None = None


class RecordedSettings(Protocol):
    """The federation settings the records read (the loop's :class:`~fedlit.engine.loop.settings.Settings`)."""

    @property
    def rounds(self) -> int: ...

    @property
    def clients_per_round(self) -> int | float | None: ...

    @property
    def local_epochs(self) -> int: ...

    @property
    def local_steps(self) -> int | None: ...

    @property
    def seed(self) -> int: ...


class RecordedData(Protocol):
    """The data the records read (the loop's :class:`~fedlit.engine.loop.protocols.DataSource`)."""

    def num_examples(self, client_id: str, split: str) -> int: ...

    def class_counts(self) -> dict[str, dict[str, list[int]]] | None: ...

    def manifest(self) -> dict[str, Any]: ...


class RecordedRun(Protocol):
    """What the records read (and, for ``energy``, write) of a run: the loop's :class:`~fedlit.engine.loop.run.Run`."""

    #: The energy meter of the current fit (:mod:`fedlit.engine.records.energy`); None before one starts.
    energy: dict[str, Any] | None

    @property
    def state(self) -> RunState: ...

    @property
    def settings(self) -> RecordedSettings: ...

    @property
    def out_dir(self) -> Path: ...

    @property
    def config(self) -> dict[str, Any]: ...

    @property
    def module(self) -> FederatedModule: ...

    @property
    def datamodule(self) -> RecordedData: ...

    @property
    def strategy(self) -> Strategy: ...

    @property
    def callbacks(self) -> list[Any]:
        """The strategy, then the extra callbacks."""

    @property
    def fabric(self) -> Fabric: ...

    @property
    def baseline_run(self) -> Path | None: ...

    @property
    def baseline_compare(self) -> str: ...

    @property
    def client_ids(self) -> list[str]: ...

    @property
    def train_client_ids(self) -> list[str]: ...

    @property
    def unseen_client_ids(self) -> list[str]: ...
