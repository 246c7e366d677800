"""Deprecated path of :mod:`fedlit.engine.speedups.fused_eval`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.engine.speedups.fused_eval")
