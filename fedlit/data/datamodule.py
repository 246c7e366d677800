"""Deprecated path of :mod:`fedlit.data.common.datamodule`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.data.common.datamodule")
