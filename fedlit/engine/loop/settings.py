"""The settings of a federation (the recipe's ``federation`` section), checked when they are built.

:class:`Settings` is the schema of the ``federation`` section (jsonargparse reads its fields and their
documentation for ``--help``) and of the facade's keyword settings (``rounds=3``...); every problem is collected
and reported in one :class:`~fedlit.core.errors.ConfigError` naming the options as spelled in a recipe.
:class:`LocalSettings` is the part a client's turn reads.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any, Literal

from lightning.fabric.loggers import Logger

from fedlit.core.errors import ConfigError


@dataclass
class Settings:
    """The federated loop's settings.

    Args:
        rounds: Number of server rounds R.
        clients_per_round: Clients sampled per round: a count (int >= 1), a fraction of all clients
            (float in (0, 1]), or None for every client.
        local_epochs: Passes over the client's training data per round (ignored when ``local_steps`` is set).
        local_steps: Exactly this many optimizer steps per round (cycling through the data), instead of epochs.
        optimizer_state: ``reset`` starts every client turn from a fresh optimizer state; ``persist`` keeps each
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
            the same aggregation (no DDP; see :mod:`fedlit.engine.loop.ranks`). Results do not depend on the number of
            processes.
        num_nodes: Fabric nodes (machines) of a multi-node run, ``devices`` processes each (torchrun or SLURM's
            ``srun`` start them; see ``docs/deployment.md``).
        precision: Fabric precision (``32-true``, ``bf16-mixed``, ``16-mixed``...).
        checkpoint_every: Save ``checkpoints/last.ckpt`` every this many rounds (and at the last round).
        store_device: Where the client store keeps tensors.
        progress_bar: Show a progress bar over rounds and clients.
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
            :mod:`fedlit.engine.loop.evaluate`).
        unseen_finetune_steps: Local optimizer steps an unseen client takes on its own train split from the model
            it receives before its second test (0, the default: no fine-tuned test).
        max_update_norm: The largest L2 norm of a client's update (its uploaded shared tensors minus what the server
            sent it) that the server aggregates; a larger one is rejected (left out of the round, a fault). None,
            the default: no absolute bound. See :mod:`fedlit.engine.loop.screening`.
        max_update_ratio: The largest update norm relative to the size of what the client was sent (its L2 norm, at
            least 1); a larger one is rejected. 1000 by default catches a scaled or corrupted upload long before its
            aggregate overflows; None: no relative bound.
        allow_dropped_callbacks: Let a resumed run go on without a callback of the checkpoint's run that reports on
            the whole run in ``results.json`` (the privacy callbacks). False (the default) refuses such a resume: its
            next rounds would run without it (for differential privacy: released without noise) while the results
            would lose what it reported. True continues, the drop recorded in ``config.json`` (``resumed``) and
            ``results.json`` (``dropped_callbacks``, and a note in the callback's section: its figures, an epsilon
            say, cover only the rounds it ran).
        threads: Intra-op CPU threads of PyTorch in this process (``torch.set_num_threads``, set when the run is
            set up, for each of its processes). CPU kernels split their sums by thread, so a model trained on the
            CPU gives bit-identical results on other machines, core counts and launchers only at the same thread
            count: set it (1 is the surest, and the fastest for tiny models) to pin them. None, the default,
            leaves PyTorch's own choice (``OMP_NUM_THREADS`` or the core count; Lightning divides the cores among
            the processes it launches). The generated data sets and splits never depend on it.
        cache_features: ``off`` (the default) runs the module's feature extractor (``backbone``) at every pass;
            ``memory`` computes a frozen extractor's features once per sample, at their first use, and trains and
            evaluates the head from them (head-only methods: linear probing, a frozen backbone under FedAvg, FedPer,
            FedRep...); ``disk`` also keeps them in ``out_dir/feature_cache``, where a resumed run reads them back.
            The results equal those of ``off`` to float rounding (see :mod:`fedlit.engine.speedups.features`); where the
            extractor trains or is random (LoRA, dropout) or the train inputs are augmented, the run warns and goes
            on without the cache.
        fused_clients: Clients trained together, K at a time, in one forward and backward pass through the shared
            frozen backbone (each sample through its own client's LoRA and head, each client's optimizer stepping
            its own tensors); 1, the default, trains them one after the other. The result is that of sequential
            turns to floating-point rounding; a run where it could not be (a strategy not marked ``fusable``,
            BatchNorm in train mode, dropout, per-step callback hooks...) is refused when it is set up, naming the
            cause. See :mod:`fedlit.engine.speedups.fused`.
        reuse_evaluations: Give a client the metrics of its last evaluation again when nothing that evaluation
            read has changed since (what the server sends it, its stored tensors and state, the frozen buffers):
            the clients a sampled round did not train, under a strategy that left what it sends them unchanged.
            True by default; the metrics are those a new evaluation would compute. Runs where an input could be
            missed (``on_client_evaluate_start`` hooks, fine-tuning before evaluation, several processes) evaluate
            every client anyway. See :mod:`fedlit.engine.speedups.reuse`.
    """

    rounds: int = 10
    clients_per_round: int | float | None = None
    local_epochs: int = 1
    local_steps: int | None = None
    optimizer_state: Literal["reset", "persist"] = "reset"
    eval_every: int = 1
    selection_metric: str | None = None
    seed: int = 0
    accelerator: str = "auto"
    devices: int | str = 1
    num_nodes: int = 1
    precision: str = "32-true"
    checkpoint_every: int = 1
    store_device: str = "cpu"
    progress_bar: bool = True
    on_client_error: Literal["raise", "skip"] = "raise"
    min_clients: int = 1
    client_timeout: float | None = None
    loggers: list[Logger] | None = None
    unseen_clients: list[str] | int | None = None
    unseen_finetune_steps: int = 0
    max_update_norm: float | None = None
    max_update_ratio: float | None = 1000.0
    allow_dropped_callbacks: bool = False
    threads: int | None = None
    cache_features: Literal["off", "memory", "disk"] = "off"
    fused_clients: int = 1
    reuse_evaluations: bool = True

    def __post_init__(self) -> None:
        problems = self.problems(vars(self))
        if problems:
            raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
        if self.client_timeout is not None:
            self.client_timeout = float(self.client_timeout)
        if isinstance(self.unseen_clients, list | tuple):
            self.unseen_clients = list(self.unseen_clients)

    @staticmethod
    def problems(values: dict[str, Any], metrics: Collection[str] = (), default_metric: str | None = None,
                 owner: str = "the module") -> list[str]:
        """Every problem of the settings ``values`` (all fields), each naming the option as in a recipe; with the
        module's ``metrics`` and ``default_metric`` (``owner``: the module's class name), also those of
        ``selection_metric``."""
        problems = []
        for key, low in (("rounds", 1), ("local_epochs", 1), ("eval_every", 1), ("checkpoint_every", 1),
                         ("min_clients", 1), ("num_nodes", 1)):
            if values[key] < low:
                problems.append(f"federation.{key}={values[key]} must be >= {low}")
        if seed_problem(values["seed"]) is not None:
            problems.append(seed_problem(values["seed"]))
        if values["client_timeout"] is not None and not values["client_timeout"] > 0:
            problems.append(f"federation.client_timeout={values['client_timeout']} must be > 0 seconds "
                            "(or null: no limit)")
        for key in ("max_update_norm", "max_update_ratio"):
            if values[key] is not None and not values[key] > 0:
                problems.append(f"federation.{key}={values[key]} must be > 0 (or null: no bound)")
        if values["threads"] is not None and values["threads"] < 1:
            problems.append(f"federation.threads={values['threads']} must be >= 1 (or null: PyTorch's default)")
        if isinstance(values["fused_clients"], bool) or not isinstance(values["fused_clients"], int) \
                or values["fused_clients"] < 1:
            problems.append(f"federation.fused_clients={values['fused_clients']!r} must be an integer >= 1 (1: one "
                            "client at a time)")
        if values["unseen_finetune_steps"] < 0:
            problems.append(f"federation.unseen_finetune_steps={values['unseen_finetune_steps']} must be >= 0")
        unseen = values["unseen_clients"]
        if isinstance(unseen, int) and unseen < 0:
            problems.append(f"federation.unseen_clients={unseen} must be >= 0 (a count) or a list of ids")
        if isinstance(unseen, list) and len(set(unseen)) < len(unseen):
            problems.append(f"federation.unseen_clients={unseen} lists a client twice")
        if values["local_steps"] is not None and values["local_steps"] < 1:
            problems.append(f"federation.local_steps={values['local_steps']} must be >= 1 "
                            "(or null for local_epochs)")
        if values["optimizer_state"] not in ("reset", "persist"):
            problems.append(f"federation.optimizer_state={values['optimizer_state']!r} is not one of "
                            "['reset', 'persist']")
        if values["cache_features"] not in ("off", "memory", "disk"):
            problems.append(f"federation.cache_features={values['cache_features']!r} is not one of "
                            "['off', 'memory', 'disk']")
        if values["on_client_error"] not in ("raise", "skip"):
            problems.append(f"federation.on_client_error={values['on_client_error']!r} is not one of "
                            "['raise', 'skip']")
        per_round = values["clients_per_round"]
        if isinstance(per_round, float) and not 0 < per_round <= 1:
            problems.append(f"federation.clients_per_round={per_round}: a fraction must be in (0, 1]")
        if isinstance(per_round, int) and per_round < 1:
            problems.append(f"federation.clients_per_round={per_round} must be >= 1")
        if metrics:
            chosen = values["selection_metric"]
            if chosen is None and default_metric not in metrics:
                problems.append(f"{owner}.default_selection_metric={default_metric!r} is not one of its "
                                f"metrics {sorted(metrics)}; set federation.selection_metric")
            elif chosen is not None and chosen not in metrics:
                problems.append(f"federation.selection_metric={chosen!r} is not one of {sorted(metrics)}")
        return problems

    @classmethod
    def from_options(cls, options: dict[str, Any], metrics: Collection[str] = (), default_metric: str | None = None,
                     owner: str = "the module") -> Settings:
        """Settings from keyword options: an unknown one is refused with the valid names and the closest match, and
        every problem of the values (and of ``selection_metric`` among the module's ``metrics``) in one error."""
        cls.check_names(options)
        values = {f.name: f.default for f in fields(cls)} | dict(options)
        problems = cls.problems(values, metrics, default_metric, owner)
        if problems:
            raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
        return cls(**options)

    @classmethod
    def check_names(cls, options: dict[str, Any]) -> None:
        """Refuse an option that is not a setting, with the valid names and the closest match."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"federation.{unknown[0]} is not a federation setting.{hint} Valid settings: "
                              f"{', '.join(names)}.")

    def local(self) -> LocalSettings:
        """What a client's turn reads."""
        return LocalSettings(self.local_epochs, self.local_steps, self.optimizer_state, self.client_timeout)


def seed_problem(seed: Any) -> str | None:
    """What is wrong with ``federation.seed`` (None: nothing): torch and numpy take seeds in [0, 2**32)."""
    if isinstance(seed, int) and not 0 <= seed < 2**32:
        return f"federation.seed={seed} must be in [0, 2**32) (torch and numpy refuse other seeds)"
    return None


def check_seed(seed: Any) -> None:
    """Refuse a ``federation.seed`` out of range before anything is seeded with it (Lightning's message does not
    name the option)."""
    problem = seed_problem(seed)
    if problem is not None:
        raise ConfigError(f"Invalid federation settings: {problem}.")


@dataclass(frozen=True)
class LocalSettings:
    """The local-training settings of a client's turn (see :class:`Settings`)."""

    local_epochs: int = 1
    local_steps: int | None = None
    optimizer_state: Literal["reset", "persist"] = "reset"
    client_timeout: float | None = None
