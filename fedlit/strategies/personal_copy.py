"""Deprecated path of :mod:`fedlit.strategies.common.personal_copy`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.strategies.common.personal_copy")
