"""Deprecated path of :mod:`fedlit.models.sam.blocks`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.models.sam.blocks")
