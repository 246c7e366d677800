"""The loop: a run from set-up to report, its rounds, each client's turn and evaluation, where the turns run.

It uses the records (:mod:`fedlit.engine.records`) to write what a run leaves behind and knows the speed-ups
(:mod:`fedlit.engine.speedups`) only through the :class:`~fedlit.engine.loop.run.Speedup` seam.
"""
