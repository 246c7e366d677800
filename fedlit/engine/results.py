"""Deprecated path of :mod:`fedlit.engine.loop.results`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.engine.loop.results")
