"""Federation: the one Fabric-based federated loop.

::

    print the per-client class counts and the tensors, parameters and MB per role; on_fit_start
    for server_round in 1..R:
        on_round_start
        clients = strategy.select_clients(server_round, client_ids, num_clients, generator)   # seeded
        for each client k:
            load k from the store; received = strategy.configure_client(...) copied into the model
            on_client_fit_start; local training (training_step, fabric.backward, optimizer step, Lightning
            hook names on the callbacks); update = k's shared tensors + extras; on_client_fit_end; save k
        quarantine non-finite updates, leave out turns past client_timeout (and, with on_client_error=skip,
        clients that raised)
        on_before_aggregate; strategy.aggregate(server_round, updates)
        evaluation (validation and test, per client), logging
        on_round_end; checkpoint; stop here if a callback set should_stop (EarlyStopping)
    on_fit_end

One live module is trained; every client's personal tensors live in the :class:`~fedlit.core.store.ClientStore`.
Each client's local training re-seeds the global and data-loader RNGs from ``(seed, round, client)``, so a run
does not depend on client order and a resumed run continues exactly. The phases live in :mod:`fedlit.engine`:
a round in :mod:`~fedlit.engine.rounds`, a client's turn in :mod:`~fedlit.engine.client`, evaluation and the report
in :mod:`~fedlit.engine.evaluate`, checkpoints and resume checks in :mod:`~fedlit.engine.resume`; where the clients'
turns run (this process, the ranks of a multi-device run, a Flower deployment) is ``Federation.executor``
(:mod:`~fedlit.engine.executor`).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.fabric import Fabric
from lightning.fabric.loggers import Logger, TensorBoardLogger
from lightning.pytorch import Callback
from tqdm.auto import tqdm

from fedlit.callbacks import check_callbacks
from fedlit.core.checkpoint_io import load_checkpoint
from fedlit.core.errors import ConfigError
from fedlit.core.store import ClientStore
from fedlit.data import FederatedDataModule
from fedlit.engine import baseline, energy, optim, ranks, record, rounds
from fedlit.engine import client as local
from fedlit.engine import evaluate as evaluation
from fedlit.engine import resume as state
from fedlit.engine.executor import LocalExecutor
from fedlit.engine.history import EvaluationHistory
from fedlit.engine.ranks import RankExecutor
from fedlit.engine.run_folder import claim_run_dir
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy


def derive_seed(*parts: Any) -> int:
    """A stable 62-bit seed from ``parts`` (independent of Python's hash randomization)."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


def num_selected(clients_per_round: int | float | None, num_clients: int) -> int:
    """How many of ``num_clients`` clients train in a round under ``federation.clients_per_round`` (a count, a
    fraction rounded to the nearest count and at least 1, or None for all of them)."""
    if clients_per_round is None:
        return num_clients
    if isinstance(clients_per_round, float):
        return max(1, round(clients_per_round * num_clients))
    return clients_per_round


class Federation:
    """Runs a federated experiment: rounds of client sampling, local training, aggregation and evaluation.

    Args:
        module: The client model (one live instance whatever the number of clients).
        datamodule: Per-client data.
        strategy: The server algorithm.
        rounds: Number of server rounds R.
        clients_per_round: Clients sampled per round: a count (int >= 1), a fraction of all clients
            (float in (0, 1]), or None for every client.
        local_epochs: Passes over the client's training data per round (ignored when ``local_steps`` is set).
        local_steps: Exactly this many optimizer steps per round (cycling through the data), instead of epochs.
        optimizer_state: ``reset`` builds a fresh optimizer for every client turn; ``persist`` keeps each
            client's optimizer state (momenta), and its learning-rate schedule of interval ``step``, in the store
            between its turns.
        eval_every: Evaluate every this many rounds (the last round is always evaluated).
        selection_metric: Metric whose mean over clients on validation picks the reported best round (its
            direction from the module's ``higher_is_better``); None: the module's ``default_selection_metric``
            (``accuracy`` for classification, ``c_index`` for survival).
        seed: Seed of client sampling and local training.
        accelerator: Fabric accelerator: ``auto`` (the default: a GPU when there is one, else the CPU), ``cpu``,
            ``cuda``, ``mps``...
        devices: Fabric devices: the processes per node. More than one process in all (``devices`` x
            ``num_nodes``) shards the *clients* over the ranks, each rank training and evaluating the clients it
            owns (balanced by train-split size) on one unwrapped module, the uploads gathered on every rank before
            the same aggregation (no DDP; see :mod:`fedlit.engine.ranks`). Results do not depend on the number of
            processes.
        num_nodes: Fabric nodes (machines) of a multi-node run, ``devices`` processes each (torchrun or SLURM's
            ``srun`` start them; see ``docs/deployment.md``).
        precision: Fabric precision (``32-true``, ``bf16-mixed``, ``16-mixed``...).
        out_dir: Where TensorBoard logs, checkpoints, the manifest and the result tables go.
        callbacks: Extra callbacks, called after the strategy. They must act in the loop's hooks
            (:data:`fedlit.callbacks.LOOP_HOOKS`): Lightning's Trainer-only callbacks (``EarlyStopping``,
            ``ModelCheckpoint``...) are refused with what to use instead. One that sets ``should_stop`` (and
            ``stop_reason``) on the federation ends the run after the round (:class:`fedlit.callbacks.EarlyStopping`).
        checkpoint_every: Save ``checkpoints/last.ckpt`` every this many rounds (and at the last round).
        store_device: Where the client store keeps tensors.
        progress_bar: Show a progress bar over rounds and clients.
        config: The resolved run configuration, saved with the run (``config.json``) and checked on resume.
        on_client_error: ``raise`` stops the run when a client's turn raises; ``skip`` leaves that client out of
            the round with a warning (recorded in the results and TensorBoard).
        min_clients: The fewest clients whose updates a round needs to aggregate (after skipped, quarantined and
            timed-out ones are left out); fewer stops the run with a clear error, its last checkpoint kept.
        client_timeout: Seconds a client's turn may take (None, the default: no limit). In simulation a turn
            that takes longer (loading and training, checked after each optimizer step) stops there and is left
            out of the round as timed out, with a warning, its stored state unchanged (as a quarantined one); in
            a deployment it is how long the server waits for a client's reply.
        loggers: Lightning Fabric loggers (``class_path`` + ``init_args`` in a recipe); None means TensorBoard in
            ``out_dir/tensorboard``. ``out_dir/metrics.csv`` is written whatever the loggers.
        unseen_clients: Clients held out of training, to measure how the federation serves newcomers: a list of
            client ids, or an int k for the last k clients that would train; None (the default) holds out none.
            They never train nor count in the per-round means; at the final test they are evaluated with what the
            strategy sends a new client, and after ``unseen_finetune_steps`` local steps from it (see
            :mod:`fedlit.engine.evaluate`).
        unseen_finetune_steps: Local optimizer steps an unseen client takes on its own train split from the model
            it receives before its second test (0, the default: no fine-tuned test).
    """

    def __init__(
        self,
        module: FederatedModule,
        datamodule: FederatedDataModule,
        strategy: Strategy,
        *,
        rounds: int = 10,
        clients_per_round: int | float | None = None,
        local_epochs: int = 1,
        local_steps: int | None = None,
        optimizer_state: Literal["reset", "persist"] = "reset",
        eval_every: int = 1,
        selection_metric: str | None = None,
        seed: int = 0,
        accelerator: str = "auto",
        devices: int | str = 1,
        num_nodes: int = 1,
        precision: str = "32-true",
        out_dir: str | Path = "runs/fedlit",
        callbacks: list[Callback] | None = None,
        checkpoint_every: int = 1,
        store_device: str = "cpu",
        progress_bar: bool = True,
        config: Mapping[str, Any] | None = None,
        on_client_error: Literal["raise", "skip"] = "raise",
        min_clients: int = 1,
        client_timeout: float | None = None,
        loggers: list[Logger] | None = None,
        unseen_clients: list[str] | int | None = None,
        unseen_finetune_steps: int = 0,
    ) -> None:
        problems = []
        for key, value, low in (("rounds", rounds, 1), ("local_epochs", local_epochs, 1),
                                ("eval_every", eval_every, 1), ("checkpoint_every", checkpoint_every, 1),
                                ("min_clients", min_clients, 1), ("num_nodes", num_nodes, 1)):
            if value < low:
                problems.append(f"federation.{key}={value} must be >= {low}")
        if client_timeout is not None and not client_timeout > 0:
            problems.append(f"federation.client_timeout={client_timeout} must be > 0 seconds (or null: no limit)")
        if unseen_finetune_steps < 0:
            problems.append(f"federation.unseen_finetune_steps={unseen_finetune_steps} must be >= 0")
        if isinstance(unseen_clients, int) and unseen_clients < 0:
            problems.append(f"federation.unseen_clients={unseen_clients} must be >= 0 (a count) or a list of ids")
        if isinstance(unseen_clients, list) and len(set(unseen_clients)) < len(unseen_clients):
            problems.append(f"federation.unseen_clients={unseen_clients} lists a client twice")
        if local_steps is not None and local_steps < 1:
            problems.append(f"federation.local_steps={local_steps} must be >= 1 (or null for local_epochs)")
        if optimizer_state not in ("reset", "persist"):
            problems.append(f"federation.optimizer_state={optimizer_state!r} is not one of ['reset', 'persist']")
        if on_client_error not in ("raise", "skip"):
            problems.append(f"federation.on_client_error={on_client_error!r} is not one of ['raise', 'skip']")
        if isinstance(clients_per_round, float) and not 0 < clients_per_round <= 1:
            problems.append(f"federation.clients_per_round={clients_per_round}: a fraction must be in (0, 1]")
        if isinstance(clients_per_round, int) and clients_per_round < 1:
            problems.append(f"federation.clients_per_round={clients_per_round} must be >= 1")
        known = set(module.higher_is_better)
        if selection_metric is None:
            selection_metric = module.default_selection_metric
            if known and selection_metric not in known:
                problems.append(f"{type(module).__name__}.default_selection_metric={selection_metric!r} is not one "
                                f"of its metrics {sorted(known)}; set federation.selection_metric")
        elif known and selection_metric not in known:
            problems.append(f"federation.selection_metric={selection_metric!r} is not one of {sorted(known)}")
        if problems:
            raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
        self.module, self.datamodule, self.strategy = module, datamodule, strategy
        self.rounds, self.clients_per_round = rounds, clients_per_round
        self.local_epochs, self.local_steps = local_epochs, local_steps
        self.optimizer_state, self.eval_every, self.seed = optimizer_state, eval_every, seed
        self.checkpoint_every, self.progress_bar = checkpoint_every, progress_bar
        self.on_client_error, self.min_clients = on_client_error, min_clients
        self.client_timeout = None if client_timeout is None else float(client_timeout)
        self.unseen_clients = list(unseen_clients) if isinstance(unseen_clients, list) else unseen_clients
        self.unseen_finetune_steps = unseen_finetune_steps
        #: A finished run of the Local strategy on the same data and seed: the report adds each client's gain over
        #: it (:mod:`fedlit.engine.baseline`); set by ``fedlit fit --baseline_run``.
        self.baseline_run: Path | None = None
        self.out_dir = Path(out_dir)
        self.config = dict(config or {})
        check_callbacks(list(callbacks or []))
        self.callbacks: list[Callback] = [strategy, *(callbacks or [])]
        self.fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes, precision=precision,
                             callbacks=list(self.callbacks),
                             loggers=[TensorBoardLogger(root_dir=self.out_dir, name="tensorboard", version="")]
                             if loggers is None else list(loggers))
        self.store = ClientStore(store_device)
        #: Where the clients' turns and evaluations run (:mod:`fedlit.engine.executor`): this process by default.
        self.executor: Any = LocalExecutor()
        self.history = EvaluationHistory(selection_metric, module.higher_is_better)
        self.server_round = 0
        self.comm = {"upload_bytes": 0, "download_bytes": 0, "eval_download_bytes": 0}
        self.faults: list[dict[str, Any]] = []
        self.identity: dict[str, Any] = {}
        self.lr_schedule: optim.RoundSchedule | None = None  # the module's schedule of interval "round"
        self.timing: dict[str, Any] = {}  # start time and wall time of the run (see fedlit.engine.record)
        self._wrapped: Any = None
        self._launched = False
        self._active_hooks: set[str] = set()
        #: Set by a callback (e.g. :class:`~fedlit.callbacks.EarlyStopping`) to end the run after this round.
        self.should_stop = False
        self.stop_reason: str | None = None
        #: ``{"round", "reason"}`` once the run has stopped before ``rounds``; in ``results.json``.
        self.stopped_early: dict[str, Any] | None = None
        self._bar: Any = None
        self._bar_client, self._bar_shown = "", 0.0

    # -------------------------------------------------------------------------------------------- set-up
    @property
    def client_ids(self) -> list[str]:
        """Every client of the federation (the unseen ones included)."""
        return self.datamodule.client_ids

    @property
    def unseen_client_ids(self) -> list[str]:
        """The clients ``federation.unseen_clients`` holds out: never trained, evaluated only at the final test."""
        if not self.unseen_clients:
            return []
        if isinstance(self.unseen_clients, int):
            return self._data_train_client_ids()[-self.unseen_clients:]
        return [c for c in self.client_ids if c in set(self.unseen_clients)]

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
        return [c for c in self._data_train_client_ids() if c not in unseen]

    def _data_train_client_ids(self) -> list[str]:
        return list(getattr(self.datamodule, "train_client_ids", self.datamodule.client_ids))

    def setup(self, ckpt_path: str | Path | None = None) -> None:
        """Prepare data, roles, the live module, the store and the strategy; resume from ``ckpt_path``.

        Only the first call builds; a later one (``evaluate`` after ``fit``) only loads ``ckpt_path`` if given.
        """
        if self._wrapped is not None:
            if ckpt_path is not None:
                state.restore(self, load_checkpoint(ckpt_path), ckpt_path)
            return
        self.launch()
        self.datamodule.setup()
        self._check_compatible()
        roles = self.strategy.configure_roles(self.module.parameter_roles())
        self.module.set_parameter_roles(roles)
        if not any(p.requires_grad for p in self.module.parameters()):
            raise ConfigError(
                "Nothing to train: every parameter is frozen. Give a role rule that makes some tensors `shared` or "
                "`personal` (model.init_args.roles)."
            )
        if not roles.names("shared") and self.strategy.communicates:
            warnings.warn(f"{self.strategy!r} shares no tensor: every client will train alone.", stacklevel=2)
        if self.fabric.world_size == 1:
            self._wrapped = self.fabric.setup_module(self.module)
        else:  # ranks train different clients: no DDP wrapper, whose backward would average their gradients
            self._wrapped = self.fabric.strategy.precision.convert_module(self.module).to(self.fabric.device)
            if type(self.executor) is LocalExecutor:
                self.executor = RankExecutor()
                self.executor.setup(self)  # before a resume fills the store: each rank keeps its own clients only
        self.lr_schedule = optim.round_schedule(self.module)
        self._active_hooks = _overridden_hooks(self.fabric._callbacks)
        self.identity = state.identity(self)
        self.store.set_initial(self.module.named_tensors("personal"))
        counts = self.datamodule.class_counts()  # None for a task without classes
        training = self.train_client_ids
        self.strategy.initialize(self.module.named_tensors("shared"), training,
                                 None if counts is None else {c: counts[c]["train"] for c in training}, roles=roles)
        if ckpt_path is not None:
            state.restore(self, load_checkpoint(ckpt_path), ckpt_path)
            state.record_resume(self, self.out_dir)
        self.executor.setup(self)

    def launch(self) -> None:
        """Start the run's processes when it spans several devices or nodes (``fabric.launch()``: Fabric's own
        launcher re-runs this command once per further local device, torchrun and SLURM start them themselves);
        nothing for one process, or once launched."""
        if self.fabric.world_size > 1 and not self._launched:
            self.fabric.launch()
            self._launched = True

    def _check_compatible(self) -> None:
        task = getattr(self.datamodule, "task", None)
        problems = [f"{section} {type(obj).__name__} accepts tasks {sorted(obj.accepted_tasks)} but data "
                    f"{type(self.datamodule).__name__} has task {task!r}"
                    for section, obj in (("model", self.module), ("strategy", self.strategy))
                    if task is not None and getattr(obj, "accepted_tasks", None) is not None
                    and task not in obj.accepted_tasks]
        for attr in ("task", "num_classes") if not problems else ():
            ours, theirs = getattr(self.module, attr, None), getattr(self.datamodule, attr, None)
            if ours is not None and theirs is not None and ours != theirs:
                problems.append(f"model.init_args.{attr}={ours!r} but the data set has {attr}={theirs!r}")
        problems += self._unseen_problems()
        count = self._num_selected()
        if isinstance(self.clients_per_round, int) and count > len(self.train_client_ids):
            problems.append(f"federation.clients_per_round={count} but the data has only "
                            f"{len(self.train_client_ids)} clients that train")
        if problems:
            raise ConfigError("Model, strategy and data do not fit: " + "; ".join(problems) + ".")

    def _unseen_problems(self) -> list[str]:
        if not self.unseen_clients:
            return []
        trainable = self._data_train_client_ids()
        if isinstance(self.unseen_clients, int):
            if self.unseen_clients >= len(trainable):
                return [f"federation.unseen_clients={self.unseen_clients} holds out every client that trains (the data "
                        f"has {len(trainable)}); hold out fewer"]
            return []
        problems = []
        unknown = [c for c in self.unseen_clients if c not in self.client_ids]
        if unknown:
            problems.append(f"federation.unseen_clients: {unknown} are not clients of the data set (its clients: "
                            f"{self.client_ids[:10]}{' ...' if len(self.client_ids) > 10 else ''})")
        evaluation_only = [c for c in self.unseen_clients if c in self.client_ids and c not in trainable]
        if evaluation_only:
            problems.append(f"federation.unseen_clients: {evaluation_only} are already evaluation-only in the data "
                            "set (evaluated every round with what a new client receives); leave them out of the list")
        if not set(trainable) - set(self.unseen_clients):
            problems.append(f"federation.unseen_clients={self.unseen_clients} holds out every client that trains")
        return problems

    def _num_selected(self) -> int:
        return num_selected(self.clients_per_round, len(self.train_client_ids))

    # ---------------------------------------------------------------------------------------------- fit
    def fit(self, ckpt_path: str | Path | None = None) -> dict[str, Any]:
        """Run the remaining rounds (all of them, or those after ``ckpt_path``) and return the test results.

        The run holds ``out_dir`` (see :mod:`fedlit.engine.run_folder`) from start to end: a fresh fit refuses a folder that
        already holds a run, and any fit refuses a folder that another live run holds.
        """
        self.launch()
        zero = self.fabric.is_global_zero  # rank 0 holds the folder and writes the files, the others write nothing
        # On an error, end the processes this one launched: they would wait for it in their next collective.
        with ranks.abort_on_error(self), (claim_run_dir(self.out_dir, resume=ckpt_path is not None) if zero
                                          else contextlib.nullcontext()):
            self.setup(ckpt_path)
            if self.baseline_run is not None:  # refuse another data set or seed before training, not after
                baseline.load(self.baseline_run, self)
            record.begin(self, resumed=ckpt_path is not None)
            if zero:
                state.save_config(self)
                rounds.log_class_counts(self)
                rounds.log_role_summary(self)
            self.fabric.call("on_fit_start", trainer=self, pl_module=self.module)
            bar = tqdm(range(self.server_round + 1, self.rounds + 1), desc="rounds",
                       disable=not self.progress_bar or not zero, initial=self.server_round, total=self.rounds)
            self._bar = bar
            try:
                for server_round in bar:
                    if self.should_stop:
                        break
                    rounds.run_round(self, server_round)
                bar.close()
                if self.should_stop and self.server_round < self.rounds:
                    self.stopped_early = {"round": self.server_round,
                                          "reason": self.stop_reason or "a callback stopped"}
                    if zero:
                        print(f"Stopped after round {self.server_round} of {self.rounds}: "
                              f"{self.stopped_early['reason']}.", flush=True)
                results = self.report()
            finally:
                self.executor.teardown(self)
            energy.stop(self)
            self.fabric.call("on_fit_end", trainer=self, pl_module=self.module)
        return results

    # ------------------------------------------------------------------------------------ local training
    def call(self, hook: str, **kwargs: Any) -> None:
        """``fabric.call`` for per-step hooks, skipped when no callback (nor the module) overrides ``hook``:
        Fabric inspects every callback's signature on each call, a measurable cost at every batch."""
        if hook in self._active_hooks:
            self.fabric.call(hook, **kwargs)

    def show_progress(self, step: int, loss: float) -> None:
        """Show the current client's local step and running loss on the progress bar (at most twice a second)."""
        now = time.monotonic()
        if self._bar is None or self._bar.disable or now - self._bar_shown < 0.5:
            return
        self._bar_shown = now
        self._bar.set_postfix_str(f"{self._bar_client} step {step} loss {loss:.4g}")

    def derive_seed(self, *parts: Any) -> int:
        """The seed of one random stream of this run (``"train"``, round, client...)."""
        return derive_seed(self.seed, *parts)

    def fit_client(self, server_round: int, client_id: str) -> local.ClientTurn:
        """Train one client for one round (:func:`fedlit.engine.client.fit_client`)."""
        return local.fit_client(self, server_round, client_id)

    # ---------------------------------------------------------------------------------------- evaluation
    def evaluate_client(self, server_round: int, client_id: str, split: str) -> dict[str, float]:
        """Metrics of ``client_id`` on ``split`` with its personal state and what the strategy gives it."""
        return evaluation.evaluate_client(self, server_round, client_id, (split,))[0].get(split, {})

    def evaluate(self, split: str, ckpt_path: str | Path) -> dict[str, Any]:
        """Evaluate the checkpoint's state on every client's ``split`` (``val`` or ``test``); print the table."""
        self.setup(ckpt_path)
        result = evaluation.evaluate_checkpoint(self, split, ckpt_path)
        record.write_evaluation(self, split, ckpt_path, result)
        return result

    def report(self) -> dict[str, Any]:
        """Print and save (Markdown, JSON, TensorBoard) the final per-client test results."""
        return evaluation.report(self)

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write everything needed to continue this run exactly (:func:`fedlit.engine.resume.save`)."""
        return state.save(self, path)


def _overridden_hooks(callbacks: list[Any]) -> set[str]:
    """Hook names that some callback implements with more than Lightning's no-op default."""
    from lightning.pytorch import LightningModule

    active = set()
    for callback in callbacks:
        for name in dir(type(callback)):
            if not name.startswith("on_"):
                continue
            impl = getattr(type(callback), name)
            defaults = (getattr(Callback, name, None), getattr(LightningModule, name, None))
            if impl not in defaults:
                active.add(name)
    return active
