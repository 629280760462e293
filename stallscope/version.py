"""The package's version, in a module of its own so that any layer can read it without
importing the package root (which re-exports the probe and the tuner)."""

__version__ = "0.1.0"
