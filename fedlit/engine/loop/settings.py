"""The settings of a federation (the recipe's ``federation`` section), each declared once, checked when built.

Each field of :class:`Settings` is declared once, by :func:`setting`: its default, its help text, its simple
bounds and whether a resumed run may change it. From that declaration come the class's documentation (which
jsonargparse reads for ``fedlit fit --help``), the bounds and choices :meth:`Settings.problems` checks, the
settings a resume may change (:data:`RESUMABLE`) and the table of ``docs/runs.md`` (:func:`settings_table`);
:func:`setting` and the documentation it generates are in :mod:`fedlit.engine.loop.settings_doc`.
:class:`Settings` is the schema of the ``federation`` section and of the facade's keyword settings
(``rounds=3``...); every problem is collected and reported in one :class:`~fedlit.core.errors.ConfigError` naming
the options as spelled in a recipe. :class:`LocalSettings` is the part a client's turn reads.
"""

from __future__ import annotations

import typing
from collections.abc import Collection
from dataclasses import Field, dataclass, fields
from typing import Any, Literal

from lightning.fabric.loggers import Logger

from fedlit.core.errors import ConfigError
from fedlit.engine.loop import settings_screening as screening
from fedlit.engine.loop.settings_doc import class_doc, markdown_table, setting


@dataclass
class Settings:
    """The federated loop's settings (the documentation of each is generated from its :func:`setting`)."""

    rounds: int = setting(10, "Number of server rounds R.", low=1, resumable=True)
    clients_per_round: int | float | None = setting(
        None,
        "Clients sampled per round: a count (int >= 1), a fraction of all clients (float in (0, 1]), or None "
        "for every client.",
    )
    local_epochs: int = setting(
        1,
        "Passes over the client's training data per round; with ``local_steps`` set it must stay 1 (a turn then "
        "takes ``local_steps`` steps: another value would be ignored, so it is refused).",
        low=1,
    )
    local_steps: int | None = setting(
        None,
        "Exactly this many optimizer steps per round (cycling through the data), instead of epochs.",
        low=1,
        note="or null for local_epochs",
    )
    optimizer_state: Literal["reset", "persist"] = setting(
        "reset",
        "``reset`` starts every client turn from a fresh optimizer state; ``persist`` keeps each client's "
        "optimizer state (momenta), and its learning-rate schedule of interval ``step``, in the store between its "
        "turns.",
    )
    eval_every: int = setting(
        1, "Evaluate every this many rounds (the last round is always evaluated).", low=1, resumable=True
    )
    selection_metric: str | None = setting(
        None,
        "Metric whose mean over clients on validation picks the reported best round (its direction from the "
        "module's ``higher_is_better``); None: the module's ``default_selection_metric`` (``accuracy`` for "
        "classification, ``c_index`` for survival).",
    )
    seed: int = setting(0, "Seed of client sampling and local training.")
    accelerator: str = setting(
        "auto",
        "Fabric accelerator: ``auto`` (the default: a GPU when there is one, else the CPU), ``cpu``, "
        "``cuda``, ``mps``...",
        resumable=True,
    )
    devices: int | str = setting(
        1,
        "Fabric devices: the processes per node. More than one process in all (``devices`` x ``num_nodes``) "
        "shards the *clients* over the ranks, each rank training and evaluating the clients it owns (balanced by "
        "train-split size) on one unwrapped module, the uploads gathered on every rank before the same aggregation "
        "(no DDP; see :mod:`fedlit.engine.loop.ranks`). Results do not depend on the number of processes.",
        resumable=True,
    )
    num_nodes: int = setting(
        1,
        "Fabric nodes (machines) of a multi-node run, ``devices`` processes each (torchrun or SLURM's ``srun`` "
        "start them; see ``docs/deployment.md``).",
        low=1,
        resumable=True,
    )
    precision: str = setting("32-true", "Fabric precision (``32-true``, ``bf16-mixed``, ``16-mixed``...).")
    matmul_precision: Literal["highest", "high", "medium"] | None = setting(
        None,
        "Internal precision of float32 matrix products during the run (``torch.set_float32_matmul_precision``, set "
        "when the run starts, the process's own restored when it ends): ``highest`` keeps float32; ``high`` lets a "
        "GPU use TF32 tensor cores (NVIDIA Ampere and later: several times faster ``32-true`` training, products "
        "with a 10-bit mantissa); ``medium`` also allows bfloat16. None, the default, leaves the process's setting "
        "(PyTorch's is ``highest``, so results do not change unless asked; a script may have set its own). "
        "Mixed precision (``bf16-mixed``) computes in bfloat16 whatever this says.",
        resumable=True,
    )
    checkpoint_every: int = setting(
        1, "Save ``checkpoints/last.ckpt`` every this many rounds (and at the last round).", low=1, resumable=True
    )
    store_device: str = setting(
        "cpu", "Where the client store and the server state keep tensors (the same after a resume).", resumable=True
    )
    progress_bar: bool = setting(True, "Show a progress bar over rounds and clients.", resumable=True)
    on_client_error: Literal["raise", "skip"] = setting(
        "raise",
        "``raise`` stops the run when a client's turn raises; ``skip`` leaves that client out of the round "
        "with a warning (recorded in the results and TensorBoard).",
        resumable=True,
    )
    min_clients: int = setting(
        1,
        "The fewest clients whose updates a round needs to aggregate (after skipped, quarantined and timed-out "
        "ones are left out); fewer stops the run with a clear error, its last checkpoint kept.",
        low=1,
        resumable=True,
    )
    client_timeout: float | None = setting(
        None,
        "Seconds a client's turn may take (None, the default: no limit). In simulation a turn that takes "
        "longer (loading and training, checked after each optimizer step) stops there and is left out of the round "
        "as timed out, with a warning, its stored state unchanged (as a quarantined one); in a deployment it is how "
        "long the server waits for a client's reply.",
        above=0,
        unit="seconds",
        note="or null: no limit",
        resumable=True,
    )
    loggers: list[Logger] | None = setting(
        None,
        "Lightning Fabric loggers (``class_path`` + ``init_args`` in a recipe); None means TensorBoard in "
        "``out_dir/tensorboard``. ``out_dir/metrics.csv`` is written whatever the loggers.",
        resumable=True,
    )
    unseen_clients: list[str] | int | None = setting(
        None,
        "Clients held out of training, to measure how the federation serves newcomers: a list of client ids, "
        "or an int k for the last k clients that would train; None (the default) holds out none. They never train "
        "nor count in the per-round means; at the final test they are evaluated with what the strategy sends a new "
        "client, and after ``unseen_finetune_steps`` local steps from it (see :mod:`fedlit.engine.loop.evaluate`).",
    )
    unseen_finetune_steps: int = setting(
        0,
        "Local optimizer steps an unseen client takes on its own train split from the model it receives before "
        "its second test (0, the default: no fine-tuned test).",
        low=0,
    )
    max_update_norm: float | None = screening.MAX_UPDATE_NORM
    max_update_ratio: float | None = screening.MAX_UPDATE_RATIO
    max_update_norm_vs_median: float | None = screening.MAX_UPDATE_NORM_VS_MEDIAN
    update_norm_action: Literal["reject", "clip"] = screening.UPDATE_NORM_ACTION
    max_client_weight: float | None = screening.MAX_CLIENT_WEIGHT
    divergence: Literal["warn", "stop", "off"] = setting(
        "warn",
        "What to do when the clients' mean training loss of a round is over 100 times that of the run's first "
        "round (a learning rate far too high: the loss grows by orders of magnitude while every value stays "
        "finite): ``warn`` (the default) warns once and goes on; ``stop`` ends the run before that round is "
        "recorded or saved, its last good checkpoint kept; ``off`` checks nothing. See "
        ":mod:`fedlit.engine.loop.divergence`.",
        resumable=True,
    )
    allow_dropped_callbacks: bool = setting(
        False,
        "Let a resumed run go on without a callback of the checkpoint's run that reports on the whole run in "
        "``results.json`` (the privacy callbacks). False (the default) refuses such a resume: its next rounds would "
        "run without it (for differential privacy: released without noise) while the results would lose what it "
        "reported. True continues, the drop recorded in ``config.json`` (``resumed``) and ``results.json`` "
        "(``dropped_callbacks``, and a note in the callback's section: its figures, an epsilon say, cover only the "
        "rounds it ran).",
        resumable=True,
    )
    threads: int | None = setting(
        None,
        "Intra-op CPU threads of PyTorch in this process (``torch.set_num_threads``, set when the run is set "
        "up, for each of its processes). CPU kernels split their sums by thread, so a model trained on the CPU "
        "gives bit-identical results on other machines, core counts and launchers only at the same thread count: "
        "set it (1 is the surest, and the fastest for tiny models) to pin them. None, the default, leaves PyTorch's "
        "own choice (``OMP_NUM_THREADS`` or the core count; Lightning divides the cores among the processes it "
        "launches). The generated data sets and splits never depend on it.",
        low=1,
        note="or null: PyTorch's default",
        resumable=True,
    )
    cache_features: Literal["off", "memory", "disk"] = setting(
        "off",
        "``off`` (the default) runs the module's feature extractor (``backbone``) at every pass; ``memory`` "
        "computes a frozen extractor's features once per sample, at their first use, and trains and evaluates the "
        "head from them (head-only methods: linear probing, a frozen backbone under FedAvg, FedPer, FedRep...); "
        "``disk`` also keeps them in ``out_dir/feature_cache``, where a resumed run reads them back. The results "
        "equal those of ``off`` to float rounding (see :mod:`fedlit.engine.speedups.features`); where the "
        "extractor trains or is random (LoRA, dropout) or the train inputs are augmented, the run warns and goes on "
        "without the cache.",
        resumable=True,
    )
    fused_clients: int = setting(
        1,
        "Clients trained together, K at a time, in one forward and backward pass through the shared frozen "
        "backbone (each sample through its own client's LoRA and head, each client's optimizer stepping its own "
        "tensors); 1, the default, trains them one after the other. The result is that of sequential turns to "
        "floating-point rounding; a run where it could not be (a strategy not marked ``fusable``, BatchNorm in "
        "train mode, dropout, per-step callback hooks...) is refused when it is set up, naming the cause. See "
        ":mod:`fedlit.engine.speedups.fused`.",
        low=1,
        integer=True,
        note="1: one client at a time",
        resumable=True,
    )
    reuse_evaluations: bool = setting(
        True,
        "Give a client the metrics of its last evaluation again when nothing that evaluation read has changed "
        "since (what the server sends it, its stored tensors and state, the frozen buffers): the clients a sampled "
        "round did not train, under a strategy that left what it sends them unchanged. True by default; the "
        "metrics are those a new evaluation would compute. Runs where an input could be missed "
        "(``on_client_evaluate_start`` hooks, fine-tuning before evaluation, several processes) evaluate every "
        "client anyway. See :mod:`fedlit.engine.speedups.reuse`.",
        resumable=True,
    )
    pooled_metrics: bool = setting(
        True,
        "Also compute the test metrics over every client's test samples together, at each evaluated round: FLamby's "
        '"pooled" figure (its pooled C-index on Fed-TCGA-BRCA), reported beside the mean over clients (``pooled`` '
        "in ``results.json``'s ``last`` and ``best``, a ``pooled`` row in the tables). It reuses the predictions "
        "the test evaluation computes: the module keeps each client's per-sample scores and targets (survival, "
        "classification: those its AUROC keeps anyway) or per-image counts (segmentation) until the round's "
        "figure is computed. False skips it. Simulation only: a Flower deployment's nodes never send their "
        "predictions, and a module without ``pooled_metrics`` has none.",
        resumable=True,
    )

    def __post_init__(self) -> None:
        problems = self.problems(vars(self))
        if problems:
            raise ConfigError("Invalid federation settings: " + "; ".join(problems) + ".")
        if self.client_timeout is not None:
            self.client_timeout = float(self.client_timeout)
        if isinstance(self.unseen_clients, list | tuple):
            self.unseen_clients = list(self.unseen_clients)

    @staticmethod
    def problems(
        values: dict[str, Any],
        metrics: Collection[str] = (),
        default_metric: str | None = None,
        owner: str = "the module",
    ) -> list[str]:
        """Every problem of the settings ``values`` (all fields), each naming the option as in a recipe: the bounds
        and choices declared with each :func:`setting`, then what one bound cannot say; with the module's
        ``metrics`` and ``default_metric`` (``owner``: the module's class name), also those of
        ``selection_metric``."""
        problems = [p for f in fields(Settings) if (p := _declared_problem(f, values[f.name])) is not None]
        problems += screening.screening_problems(values)
        if (seed := seed_problem(values["seed"])) is not None:
            problems.append(seed)
        unseen = values["unseen_clients"]
        if isinstance(unseen, int) and unseen < 0:
            problems.append(f"federation.unseen_clients={unseen} must be >= 0 (a count) or a list of ids")
        if isinstance(unseen, list) and len(set(unseen)) < len(unseen):
            problems.append(f"federation.unseen_clients={unseen} lists a client twice")
        epochs, steps = values["local_epochs"], values["local_steps"]
        if steps is not None and epochs != 1:  # 1 is the default, so a recipe may keep it beside local_steps
            problems.append(
                f"federation.local_epochs={epochs} and federation.local_steps={steps} conflict: a turn takes "
                "local_steps optimizer steps and would ignore local_epochs; give one of them (leave local_epochs "
                "out, or set local_steps: null)"
            )
        per_round = values["clients_per_round"]
        if isinstance(per_round, float) and not 0 < per_round <= 1:
            problems.append(f"federation.clients_per_round={per_round}: a fraction must be in (0, 1]")
        if isinstance(per_round, int) and per_round < 1:
            problems.append(f"federation.clients_per_round={per_round} must be >= 1")
        if metrics:
            chosen = values["selection_metric"]
            if chosen is None and default_metric not in metrics:
                problems.append(
                    f"{owner}.default_selection_metric={default_metric!r} is not one of its "
                    f"metrics {sorted(metrics)}; set federation.selection_metric"
                )
            elif chosen is not None and chosen not in metrics:
                problems.append(f"federation.selection_metric={chosen!r} is not one of {sorted(metrics)}")
        return problems

    @classmethod
    def from_options(
        cls,
        options: dict[str, Any],
        metrics: Collection[str] = (),
        default_metric: str | None = None,
        owner: str = "the module",
    ) -> Settings:
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
            raise ConfigError(
                f"federation.{unknown[0]} is not a federation setting.{hint} Valid settings: {', '.join(names)}."
            )

    def local(self) -> LocalSettings:
        """What a client's turn reads."""
        return LocalSettings(self.local_epochs, self.local_steps, self.optimizer_state, self.client_timeout)


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Settings, globalns={**globals(), "Logger": Logger})


def _choices(hint: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal`` type (and None where the type is ``Literal[...] | None``), else None."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    literal = [a for a in typing.get_args(hint) if typing.get_origin(a) is Literal]
    return (*typing.get_args(literal[0]), None) if literal and type(None) in typing.get_args(hint) else None


def _declared_problem(declared: Field[Any], value: Any) -> str | None:
    """What is wrong with ``value`` against ``declared``'s :func:`setting` (its choices or its bounds), or None."""
    name, meta, hint = declared.name, declared.metadata, _HINTS[declared.name]
    choices = _choices(hint)
    if choices is not None:
        return None if value in choices else f"federation.{name}={value!r} is not one of {list(choices)}"
    low, above = meta["low"], meta["above"]
    if low is None and above is None or value is None and type(None) in typing.get_args(hint):
        return None
    wrong_type = meta["integer"] and (isinstance(value, bool) or not isinstance(value, int))
    if not wrong_type and value is not None and (value >= low if low is not None else value > above):
        return None
    bound = f">= {low}" if low is not None else f"> {above}"
    kind = "an integer " if meta["integer"] else ""
    unit = f" {meta['unit']}" if meta["unit"] else ""
    note = f" ({meta['note']})" if meta["note"] else ""
    shown = repr(value) if meta["integer"] else value
    return f"federation.{name}={shown} must be {kind}{bound}{unit}{note}"


_HINTS = _hints()

#: Settings of the ``federation`` section that a resumed run may change (declared ``resumable`` by their
#: :func:`setting`); the others would make it another experiment.
RESUMABLE = frozenset(f.name for f in fields(Settings) if f.metadata["resumable"])


Settings.__doc__ = class_doc(fields(Settings))


def settings_table() -> str:
    """The Markdown table of the ``federation`` settings in ``docs/runs.md``: name, default, whether a resume may
    change it, and its help text (see :func:`~fedlit.engine.loop.settings_doc.markdown_table`)."""
    return markdown_table(fields(Settings))


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
