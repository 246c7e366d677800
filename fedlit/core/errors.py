"""fedlit's own errors: bad configuration, bad input files, bad checkpoints, faults of a run.

The ``fedlit`` command prints these as one line naming the option or file and the fix (exit code 2). Any other
exception (raised by user code: a custom strategy's ``aggregate``, a custom module's ``training_step``) keeps its
full traceback. Each class also derives from the built-in exception it refines, so ``except ValueError`` still
catches a configuration error.
"""

from __future__ import annotations


class FedlitError(Exception):
    """Base class of the errors fedlit reports as one clear line."""


class ConfigError(FedlitError, ValueError):
    """A recipe or command-line setting is invalid (names the key, the value and what is allowed)."""


class DataError(FedlitError, ValueError):
    """An input file or data split is unusable (names the file and row, or the client)."""


class InputFileError(FedlitError, FileNotFoundError):
    """A file or folder that the recipe names does not exist (names the option, the path tried and where to get
    the data or weights)."""


class CheckpointError(FedlitError, ValueError):
    """A checkpoint cannot be read, or does not belong to the run that resumes it."""


class RunDirError(FedlitError, ValueError):
    """A run folder is taken by another run, locked by a live one, or cannot be written."""


class NonFiniteError(FedlitError, RuntimeError):
    """Every client of a round produced a non-finite update: the run stops, its last good checkpoint kept."""


def broken(guarantee: str) -> RuntimeError:
    """The error for a guarantee of fedlit's own code that did not hold (a bug, not bad input): raised in place of an
    ``assert``, which ``python -O`` would remove. ``guarantee`` says why the condition should have held."""
    return RuntimeError(f"fedlit internal error (please report it): a guarantee did not hold: {guarantee}.")
