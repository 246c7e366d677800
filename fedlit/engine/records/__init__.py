"""The records: what a run leaves behind and shows as it goes (its folder and lock, ``metrics.csv``, the results,
TensorBoard's HParams, energy readings, the progress bar, the gain over a Local baseline, the evaluation history).
They read a run through :class:`~fedlit.engine.records.state.RecordedRun` (its progress is a
:class:`~fedlit.engine.records.state.RunState`), never import the loop and never drive it.
"""
