"""Deprecated path of :mod:`fedlit.strategies.fedmetamed.equations`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.strategies.fedmetamed.equations")
