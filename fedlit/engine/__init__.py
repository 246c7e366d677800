"""The engine: a run's rounds, its clients' turns, evaluation, results and checkpoints, one file each.

- :mod:`fedlit.engine.run`: the server side of a run (:class:`~fedlit.engine.run.Run`) and the ``Executor`` seam.
- :mod:`fedlit.engine.lifecycle`: set-up, the fit from start to end, the evaluation of a checkpoint.
- :mod:`fedlit.engine.rounds`: one server round (selection, the clients' turns, quarantine, aggregation,
  evaluation, logging, checkpoints) and the tables printed at the start of a fit.
- :mod:`fedlit.engine.client`: one client's turn over a :class:`~fedlit.engine.client.ClientContext`.
- :mod:`fedlit.engine.tasks`, :mod:`fedlit.engine.executor`, :mod:`fedlit.engine.ranks`: what the server sends a
  client, and where the turns run (this process, the ranks of a multi-device run).
- :mod:`fedlit.engine.hooks`: the one way hooks are called. :mod:`fedlit.engine.settings`: the loop's settings.
  :mod:`fedlit.engine.protocols`: what the loop reads of the data.
- :mod:`fedlit.engine.optim`: the local optimizer and its learning-rate schedule (per round or per step).
- :mod:`fedlit.engine.evaluate`: per-client evaluation of a round and of unseen clients;
  :mod:`fedlit.engine.results`: the final report; :mod:`fedlit.engine.history`: the evaluation protocol.
- :mod:`fedlit.engine.resume`: checkpoints (what they hold, what a resume must match) and the run's configuration.
- :mod:`fedlit.engine.record`: what a run records beside its checkpoints (``metrics.csv``, ``best.ckpt``, the run's
  description in ``results.json``); :mod:`fedlit.engine.hparams`: TensorBoard's HParams view;
  :mod:`fedlit.engine.energy`: energy readings; :mod:`fedlit.engine.baseline`: the gain over a Local run;
  :mod:`fedlit.engine.run_folder`: run folders and their locks; :mod:`fedlit.engine.progress`: the progress bar.
- :mod:`fedlit.engine.fused`, :mod:`fedlit.engine.fused_model`: fused multi-client training
  (``federation.fused_clients``), several clients in one forward and backward pass.

The engine knows nothing above it: the facade users build (``fedlit.federation``), the configuration and the
commands import it, never the reverse.
"""
