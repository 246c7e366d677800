"""The server side of a federation: the state a run holds between its rounds, and the seam to its clients.

A :class:`Run` holds the live module, the data, the strategy and the callbacks with their :class:`~fedlit.engine.
hooks.Hooks`, Fabric, the client store, the executor, the checkpointed schedules and, in ``run.state`` (a
:class:`~fedlit.engine.records.state.RunState`), the run's progress: round, evaluation history, communication totals,
faults, stop; its settings are ``run.settings``. The engine's server-side functions
(:mod:`fedlit.engine.loop.lifecycle`, :mod:`~fedlit.engine.loop.rounds`, :mod:`~fedlit.engine.loop.evaluate`,
:mod:`~fedlit.engine.loop.resume`...) take it. Hooks never see it: server-side hooks receive a read-only
:class:`~fedlit.core.contexts.ServerContext` over it as ``trainer`` (:meth:`Run.server_context`), and the run hands
each client's turn a :class:`~fedlit.engine.loop.client_context.ClientContext` (:meth:`Run.client_context`). The
facade users build extends it (``fedlit.federation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from lightning.fabric import Fabric
from lightning.fabric.loggers import TensorBoardLogger
from lightning.pytorch import Callback
from typing_extensions import override

from fedlit.callbacks import check_callbacks
from fedlit.core.contexts import ServerContext
from fedlit.core.errors import ConfigError
from fedlit.core.seeding import derive_seed, num_selected
from fedlit.core.store import ClientStore
from fedlit.engine.loop.client import ClientTurn
from fedlit.engine.loop.client_context import ClientContext
from fedlit.engine.loop.hooks import Hooks
from fedlit.engine.loop.protocols import DataSource
from fedlit.engine.loop.settings import Settings
from fedlit.engine.loop.tasks import EvaluateResult, EvaluateTask, FitTask
from fedlit.engine.records.history import EvaluationHistory
from fedlit.engine.records.progress import Progress
from fedlit.engine.records.state import RunState
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy

if TYPE_CHECKING:
    from lightning.fabric.connector import _PRECISION_INPUT

    from fedlit.engine.loop.optim import RoundSchedule


class Executor(Protocol):
    """Where the clients' work of a round runs: this process (:class:`~fedlit.engine.loop.executor.LocalExecutor`), the
    ranks of a Fabric run (:class:`~fedlit.engine.loop.ranks.RankExecutor`) or Flower nodes
    (:class:`fedlit.flower.server.FlowerExecutor`). Results come back in the order of the tasks."""

    def setup(self, run: Run) -> None:
        """Called once the run is set up (module, store and strategy ready), before a resume fills the store."""

    def fit(self, run: Run, server_round: int, tasks: list[FitTask]) -> list[ClientTurn | str]:
        """Each task's turn, or, with ``federation.on_client_error=skip``, a description of what it raised."""

    def evaluate(self, run: Run, server_round: int, tasks: list[EvaluateTask]) -> list[EvaluateResult]:
        """Each task's metrics."""

    def teardown(self, run: Run) -> None:
        """Called once at the end of the fit (or when it stops on an error)."""


class Speedup:
    """A speed-up plugged into a run at set-up (:mod:`fedlit.engine.speedups`): same results, less time. The loop
    knows only this seam; the facade (:class:`fedlit.federation.Federation`) gives a run the built-in ones."""

    def configure(self, run: Run) -> None:
        """Before the executor is chosen, the module set up: set ``run.client_data`` (features computed once) or
        ``run.executor`` (several clients in one pass). Default: nothing."""

    def attach(self, run: Run) -> None:
        """After the executor is set up: set ``run.evaluation_reuse``. Default: nothing."""


class Run:
    """The server side of a federation (see the module docstring).

    Args:
        module: The client model (one live instance whatever the number of clients).
        datamodule: The data (:class:`~fedlit.engine.loop.protocols.DataSource`).
        strategy: The server algorithm.
        settings: The loop's settings (checked when built).
        callbacks: Extra callbacks, called after the strategy; only those that act in the loop's hooks.
        out_dir: Where TensorBoard logs, checkpoints, the manifest and the result tables go.
        config: The resolved run configuration, saved with the run (``config.json``) and checked on resume.
        speedups: The speed-ups to plug in at set-up (:class:`Speedup`); none by default.
    """

    def __init__(
        self,
        module: FederatedModule,
        datamodule: DataSource,
        strategy: Strategy,
        settings: Settings,
        *,
        callbacks: list[Callback] | None = None,
        out_dir: str | Path = "runs/fedlit",
        config: dict[str, Any] | None = None,
        speedups: Sequence[Speedup] = (),
    ) -> None:
        problems = Settings.problems(
            vars(settings), module.higher_is_better, module.default_selection_metric, type(module).__name__
        )
        if problems:
            raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
        selection_metric = settings.selection_metric or module.default_selection_metric
        check_callbacks(list(callbacks or []), strategy=strategy, module=module)
        self.module, self.datamodule, self.strategy, self.settings = module, datamodule, strategy, settings
        self.out_dir = Path(out_dir)
        self.config = dict(config or {})
        #: A finished run of the Local strategy on the same data and seed: the report adds each client's gain over
        #: it (:mod:`fedlit.engine.records.baseline`); set by ``fedlit fit --baseline_run``.
        self.baseline_run: Path | None = None
        #: ``strict`` (``fedlit fit --baseline_compare``, the default): refuse a baseline trained otherwise (rounds,
        #: local steps or epochs, model, optimizer, selection metric); ``any``: compare anyway, recorded.
        self.baseline_compare: str = "strict"
        #: The speed-ups set up with the run (:class:`Speedup`), in order.
        self.speedups: list[Speedup] = list(speedups)
        self.callbacks: list[Callback] = [strategy, *(callbacks or [])]
        self.hooks = Hooks(self.callbacks)
        loggers = settings.loggers
        self.fabric = Fabric(
            accelerator=settings.accelerator,
            devices=settings.devices,
            num_nodes=settings.num_nodes,
            precision=cast("_PRECISION_INPUT", settings.precision),  # Fabric checks the value
            loggers=[TensorBoardLogger(root_dir=self.out_dir, name="tensorboard", version="")]
            if loggers is None
            else list(loggers),
        )
        self.store = ClientStore(settings.store_device)
        #: Where the clients' turns and evaluations run; None until set up (then this process, or its ranks).
        self.executor: Executor | None = None
        #: Each client's last evaluation, given again while its inputs are unchanged (``federation.reuse_evaluations``:
        #: :mod:`fedlit.engine.speedups.reuse`); None when every evaluation evaluates every client.
        self.evaluation_reuse: Any = None
        #: What the clients' turns read their data from: ``datamodule``, or its features computed once
        #: (``federation.cache_features``: :mod:`fedlit.engine.speedups.features`); None until set up.
        self.client_data: DataSource | None = None
        #: The run's progress: round, history, totals, faults, stop... (what a checkpoint saves of it).
        self.state = RunState(EvaluationHistory(selection_metric, module.higher_is_better))
        self.lr_schedule: RoundSchedule | None = None  # the module's schedule of interval "round"
        self.energy: dict[str, Any] | None = None  # the energy meter of a fit (see fedlit.engine.records.energy)
        self.progress = Progress()
        self.warned: set[str] = set()  # what the run's client turns have warned about (once per run each)
        self.wrapped: Any = None  # the module as Fabric set it up; None until set up
        self.launched = False

    # ------------------------------------------------------------------------------------------- progress
    # Read access to run.state for callbacks and users (the engine itself reads run.state).
    @property
    def server_round(self) -> int:
        """The last finished server round (``state.round``; 0 before the first)."""
        return self.state.round

    @property
    def history(self) -> EvaluationHistory:
        """The evaluated rounds' metrics (``state.history``)."""
        return self.state.history

    @property
    def should_stop(self) -> bool:
        """Whether a callback asked to end the run after this round (``state.should_stop``)."""
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.state.should_stop = value

    @property
    def stop_reason(self) -> str | None:
        """Why a callback stopped the run (``state.stop_reason``)."""
        return self.state.stop_reason

    @stop_reason.setter
    def stop_reason(self, value: str | None) -> None:
        self.state.stop_reason = value

    # ------------------------------------------------------------------------------------------- clients
    @property
    def client_ids(self) -> list[str]:
        """Every client of the federation (the unseen ones included)."""
        return self.datamodule.client_ids

    @property
    def unseen_client_ids(self) -> list[str]:
        """The clients ``federation.unseen_clients`` holds out: never trained, evaluated only at the final test."""
        unseen = self.settings.unseen_clients
        if not unseen:
            return []
        if isinstance(unseen, int):
            return list(self.datamodule.train_client_ids)[-unseen:]
        return [c for c in self.client_ids if c in set(unseen)]

    @property
    def evaluated_client_ids(self) -> list[str]:
        """The clients every evaluated round evaluates: all but the unseen ones."""
        unseen = set(self.unseen_client_ids)
        return [c for c in self.client_ids if c not in unseen]

    @property
    def train_client_ids(self) -> list[str]:
        """The clients that train: rounds select among them and the strategy counts them (all clients but the
        unseen ones, unless the data set marks some evaluation-only; those receive what the strategy sends a
        client yet to train)."""
        unseen = set(self.unseen_client_ids)
        return [c for c in self.datamodule.train_client_ids if c not in unseen]

    def num_selected(self) -> int:
        """How many clients a round selects (``federation.clients_per_round`` of the clients that train)."""
        return num_selected(self.settings.clients_per_round, len(self.train_client_ids))

    def num_examples(self, client_id: str, split: str) -> int:
        """Samples of ``client_id``'s ``split``."""
        return self.datamodule.num_examples(client_id, split)

    @property
    def scaler(self) -> Any:
        """The gradient scaler of 16-bit mixed precision when it is enabled, else None."""
        scaler = getattr(self.fabric.strategy.precision, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def derive_seed(self, *parts: Any) -> int:
        """The seed of one random stream of this run (``"train"``, round, client...)."""
        return derive_seed(self.settings.seed, *parts)

    def client_context(self, client_id: str) -> ClientContext:
        """What ``client_id``'s turn or evaluation in this process needs."""
        return ClientContext(
            client_id=client_id,
            module=self.module,
            fabric=self.fabric,
            data=self.datamodule if self.client_data is None else self.client_data,
            store=self.store,
            strategy=self.strategy,
            hooks=self.hooks,
            seed=self.settings.seed,
            local=self.settings.local(),
            rounds=self.settings.rounds,
            lr_schedule=self.lr_schedule,
            progress=self.progress.step,
            warned=self.warned,
        )

    def server_context(self, log: dict[str, float] | None = None) -> ServerContext:
        """What server-side hooks receive as ``trainer``: a read-only view of this run, with ``log`` (the current
        round's scalars so far) and a way to stop it (:class:`~fedlit.core.contexts.ServerContext`)."""
        return ServerContext(self, log)

    # The settings were once readable and settable as the run's own attributes (``run.rounds``); a stray
    # ``run.seed = 1`` would now silently set an attribute nothing reads, so both directions name the right place.
    def __getattr__(self, name: str) -> Any:
        if name in _SETTING_NAMES:
            raise AttributeError(
                f"{type(self).__name__}.{name} is a federation setting: read it as run.settings.{name}."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @override
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTING_NAMES:
            raise AttributeError(
                f"{type(self).__name__}.{name} is a federation setting: set it as "
                f"run.settings.{name} (before set-up), or pass it to the constructor."
            )
        super().__setattr__(name, value)


#: The names of the federation settings (:class:`~fedlit.engine.loop.settings.Settings`).
_SETTING_NAMES = frozenset(f.name for f in fields(Settings))
