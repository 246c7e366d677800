"""Deprecated path of :mod:`fedlit.strategies.common.aggregate`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.strategies.common.aggregate")
