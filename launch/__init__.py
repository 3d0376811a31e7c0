"""Launchers, the CLI and benchmarks. Importing this registers the launchers."""
from dynarl.launch import inproc, local  # noqa: F401
