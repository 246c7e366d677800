"""The engine: a federated run's loop, what it records, and the speed-ups that plug into it.

Three parts, ordered by the import contract of ``pyproject.toml`` (``speedups`` > ``loop`` > ``records``):

- :mod:`fedlit.engine.loop`: the run (:mod:`~.loop.run`, with the :class:`~.loop.run.Speedup` seam) from set-up to
  report (:mod:`~.loop.lifecycle`); one round (:mod:`~.loop.rounds`); a client's turn (:mod:`~.loop.client`, over its
  context: :mod:`~.loop.client_context`) and its evaluation (:mod:`~.loop.evaluate`); what the server sends
  (:mod:`~.loop.tasks`); the new server state checked and stored (:mod:`~.loop.aggregation`); where turns run
  (:mod:`~.loop.executor`, :mod:`~.loop.ranks`); hooks (:mod:`~.loop.hooks`); uploads screened
  (:mod:`~.loop.screening`); training that diverges (:mod:`~.loop.divergence`); settings (:mod:`~.loop.settings`,
  the screening ones in :mod:`~.loop.settings_screening`, declared and documented by :mod:`~.loop.settings_doc`); what
  the loop reads of the data (:mod:`~.loop.protocols`, :mod:`~.loop.channels`); the local optimizer
  (:mod:`~.loop.optim`); where state lives (:mod:`~.loop.placement`); checkpoints (:mod:`~.loop.resume`; what a
  resume counts as changed: :mod:`~.loop.config_diff`); the final report (:mod:`~.loop.results`).
- :mod:`fedlit.engine.records`: the run's progress and what the records read of a run (:mod:`~.records.state`:
  ``RunState``, ``RecordedRun``), the run folder (:mod:`~.records.run_folder`), ``metrics.csv`` and the run's
  description (:mod:`~.records.record`), the evaluation protocol (:mod:`~.records.history`), TensorBoard's HParams
  (:mod:`~.records.hparams`), energy (:mod:`~.records.energy`), the progress bar (:mod:`~.records.progress`), the
  gain over Local (:mod:`~.records.baseline`).
- :mod:`fedlit.engine.speedups`: cached features (:mod:`~.speedups.features`), fused clients
  (:mod:`~.speedups.fused`, :mod:`~.speedups.fused_model`, :mod:`~.speedups.fused_eval`), reused evaluations
  (:mod:`~.speedups.reuse`).

The modules left directly in this folder are the old import paths, kept for one release with a warning. The
engine knows nothing above it: the facade (``fedlit.federation``), the configuration and the commands import it.
"""
