"""Workloads for simulation: what one RL iteration asks of the devices.

`catalog.py` names the workloads (math-7b, agentic-search, ...), `generate.py`
draws their batches from a seed, `trace.py` reads a batch from a JSONL trace
instead. Both give `Group`s (`samples.py`): a prompt and its samples, lengths only.
"""
