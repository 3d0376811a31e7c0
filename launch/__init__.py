"""Launchers, the CLI and benchmarks. Importing this registers the launchers."""
from dynarl.launch import agent_launcher, inproc, local  # noqa: F401
