"""Deprecated path of :mod:`fedlit.commands.report.runs`, kept for one release."""

from fedlit.core.deprecation import moved_module

moved_module(__name__, "fedlit.commands.report.runs")
