"""fedlit's version (imported by the command line without torch)."""

__version__ = "0.1.0"
