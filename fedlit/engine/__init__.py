"""The phases of :class:`~fedlit.federation.Federation`'s round, one file each.

- :mod:`fedlit.engine.rounds`: one server round (the clients' turns, quarantine, aggregation, evaluation, logging,
  checkpoints) and the tables printed at the start of a fit.
- :mod:`fedlit.engine.client`: one client's turn (load its state, local training under the run's precision,
  finiteness checks, the upload).
- :mod:`fedlit.engine.optim`: the local optimizer and its learning-rate schedule (per round or per step).
- :mod:`fedlit.engine.evaluate`: per-client evaluation of a round, and the final report.
- :mod:`fedlit.engine.resume`: checkpoints (what they hold, what a resume must match) and the run's configuration.
- :mod:`fedlit.engine.record`: what a run records beside its checkpoints (``metrics.csv``, ``best.ckpt``, the run's
  description in ``results.json``, evaluations of its checkpoints).
- :mod:`fedlit.engine.hparams`: the curated hyperparameters and final metrics of TensorBoard's HParams view.
"""
