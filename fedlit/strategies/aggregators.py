"""Deprecated path of :mod:`fedlit.strategies.common.aggregators`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.strategies.common.aggregators")
