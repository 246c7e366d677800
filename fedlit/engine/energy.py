"""Deprecated path of :mod:`fedlit.engine.records.energy`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.engine.records.energy")
