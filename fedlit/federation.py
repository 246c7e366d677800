"""Federation: the facade users build, over the engine (:mod:`fedlit.engine`) and its settings.

``Federation(module, datamodule, strategy, rounds=10, ...)`` checks its settings
(:class:`~fedlit.engine.loop.settings.Settings`: every keyword argument below ``strategy`` is one of them) and gives the
run's life to the engine: :func:`~fedlit.engine.loop.lifecycle.fit` runs the rounds
(:mod:`fedlit.engine.loop.rounds`),
each
client's turn over a :class:`~fedlit.engine.loop.client_context.ClientContext` (:mod:`fedlit.engine.loop.client`), the
evaluation and the report (:mod:`fedlit.engine.loop.evaluate`, :mod:`fedlit.engine.loop.results`), checkpoints and
resume (:mod:`fedlit.engine.loop.resume`); where the clients' turns run is ``Federation.executor`` (this process, the
ranks of a multi-device run, a Flower deployment). A Federation is the engine's :class:`~fedlit.engine.loop.run.Run`;
callbacks never receive it: their server-side hooks get a read-only :class:`~fedlit.core.contexts.ServerContext` over
it as ``trainer``, the hooks of a client's turn that turn's :class:`~fedlit.core.contexts.ClientContext`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from fedlit.core.seeding import derive_seed, num_selected
from fedlit.engine import speedups
from fedlit.engine.loop import lifecycle, results, resume
from fedlit.engine.loop.client import ClientTurn, train_client
from fedlit.engine.loop.evaluate import evaluate_client
from fedlit.engine.loop.protocols import DataSource
from fedlit.engine.loop.run import Run
from fedlit.engine.loop.settings import Settings
from fedlit.module import FederatedModule
from fedlit.strategies.base import Strategy

__all__ = ["Federation", "Settings", "derive_seed", "num_selected"]


class Federation(Run):
    """Runs a federated experiment: rounds of client sampling, local training, aggregation and evaluation.

    Args:
        module: The client model (one live instance whatever the number of clients).
        datamodule: Per-client data.
        strategy: The server algorithm.
        settings: The loop's settings as one object; keyword ``options`` override its fields.
        callbacks: Extra callbacks, called after the strategy. They must act in the loop's hooks
            (:data:`fedlit.callbacks.LOOP_HOOKS`): Lightning's Trainer-only callbacks (``EarlyStopping``,
            ``ModelCheckpoint``...) are refused with what to use instead. One that sets ``should_stop`` (and
            ``stop_reason``) on the federation ends the run after the round (:class:`fedlit.callbacks.EarlyStopping`).
        out_dir: Where TensorBoard logs, checkpoints, the manifest and the result tables go.
        config: The resolved run configuration, saved with the run (``config.json``) and checked on resume.
        **options: The loop's settings by name (``rounds=3``, ``local_steps=5``...): the fields of
            :class:`~fedlit.engine.loop.settings.Settings`; an unknown name is refused with the closest one.
    """

    def __init__(
        self,
        module: FederatedModule,
        datamodule: DataSource,
        strategy: Strategy,
        *,
        settings: Settings | None = None,
        callbacks: list[Callback] | None = None,
        out_dir: str | Path = "runs/fedlit",
        config: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        metrics = (module.higher_is_better, module.default_selection_metric, type(module).__name__)
        if settings is None:
            settings = Settings.from_options(options, *metrics)
        elif options:
            settings = Settings.from_options(vars(settings) | options, *metrics)
        super().__init__(
            module,
            datamodule,
            strategy,
            settings,
            callbacks=callbacks,
            out_dir=out_dir,
            config=config,
            speedups=speedups.BUILT_IN,
        )

    def setup(self, ckpt_path: str | Path | None = None) -> None:
        """Prepare data, roles, the live module, the store and the strategy; resume from ``ckpt_path``
        (:func:`fedlit.engine.loop.lifecycle.setup`)."""
        lifecycle.setup(self, ckpt_path)

    def launch(self) -> None:
        """Start the run's processes when it spans several devices or nodes
        (:func:`fedlit.engine.loop.lifecycle.launch`)."""
        lifecycle.launch(self)

    def fit(self, ckpt_path: str | Path | None = None) -> dict[str, Any]:
        """Run the remaining rounds (all of them, or those after ``ckpt_path``) and return the test results."""
        return lifecycle.fit(self, ckpt_path)

    def evaluate(self, split: str, ckpt_path: str | Path) -> dict[str, Any]:
        """Evaluate the checkpoint's state on every client's ``split`` (``val`` or ``test``); print the table."""
        return lifecycle.evaluate(self, split, ckpt_path)

    def report(self) -> dict[str, Any]:
        """Print and save (Markdown, JSON, TensorBoard) the final per-client test results."""
        return results.report(self)

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write everything needed to continue this run exactly (:func:`fedlit.engine.loop.resume.save`)."""
        return resume.save(self, path)

    def fit_client(self, server_round: int, client_id: str) -> ClientTurn:
        """Train one client for one round with what the strategy sends it."""
        return train_client(
            self.client_context(client_id),
            server_round,
            self.strategy.configure_client(server_round, client_id),
            self.strategy.configure_client_extras(server_round, client_id),
        )

    def evaluate_client(self, server_round: int, client_id: str, split: str) -> dict[str, float]:
        """Metrics of ``client_id`` on ``split`` with its personal tensors and what the strategy gives it."""
        received = self.strategy.configure_evaluate(server_round, client_id)
        metrics, _ = evaluate_client(
            self.client_context(client_id),
            server_round,
            (split,),
            received,
            personalized=True,
            finetune_steps=self.strategy.eval_finetune_steps,
        )
        return metrics.get(split, {})
