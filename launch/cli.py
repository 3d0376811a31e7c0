"""The `dynarl` command line: one sub-command per job kind.

Each sub-command lives in its own module and is imported only when used, so
`dynarl --help` stays fast and a missing optional extra only breaks its own command.
"""
from __future__ import annotations

import argparse
import importlib
import sys

BENCHES = {
    "transport": "dynarl.launch.bench.transport",
    "rollout": "dynarl.launch.bench.rollout",
    "trainer": "dynarl.launch.bench.trainer",
    "scheduler": "dynarl.launch.bench.scheduler",
    "agentic": "dynarl.launch.bench.agentic",
    "hosts": "dynarl.launch.bench.hosts",
    "faults": "dynarl.launch.bench.faults",
    "async": "dynarl.launch.bench.overlap",
    "env": "dynarl.launch.bench.env",
    "memory": "dynarl.launch.bench.memory",
    "peers": "dynarl.launch.bench.peers",
}


def _bench(argv: list[str]) -> int:
    # `dynarl bench NAME --help` is the bench's own help: only the name is parsed here.
    if argv and argv[0] in BENCHES:
        return int(importlib.import_module(BENCHES[argv[0]]).main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="dynarl bench", description="Run a benchmark; ratios are measured "
                                     "side by side in one run. `dynarl bench NAME --help` lists its options.")
    parser.add_argument("name", choices=sorted(BENCHES))
    parser.parse_args(argv)  # exits with the usage (or the help)
    return 2


def _train(argv: list[str]) -> int:
    from dynarl.launch.train import main as train_main
    return train_main(argv)


def _tool(argv: list[str]) -> int:
    from dynarl.launch import tool
    return tool.main(argv)


COMMANDS = {
    "bench": _bench,
    "dashboard": lambda argv: importlib.import_module("dynarl.launch.dashboard.cli").main(argv),
    "doctor": lambda argv: importlib.import_module("dynarl.launch.doctor").main(argv),
    "eval": lambda argv: importlib.import_module("dynarl.launch.eval").main(argv),
    "export": lambda argv: importlib.import_module("dynarl.launch.export").main(argv),
    "tool": _tool,
    "graph": lambda argv: importlib.import_module("dynarl.launch.graph").main(argv),
    "sim": lambda argv: importlib.import_module("dynarl.launch.sim.cli").main(argv),
    "train": _train,
}


SUMMARIES = {
    "bench": "a benchmark (transport, rollout, trainer, scheduler, agentic, hosts, faults, async, env, memory, peers), "
             "ratios measured side by side",
    "dashboard": "a run directory's live dashboard (a web page: curves, device moves, samples)",
    "doctor": "the production path on this machine's devices (--gpu: one CUDA GPU), one JSON report",
    "eval": "mean reward and pass@k of a run's checkpoint or an HF folder on held-out problems",
    "export": "a run's trained policy as an HF folder (transformers loads it)",
    "graph": "the static hypergraph of a workflow file (components and channels)",
    "sim": "the real controller and scheduler on emulated devices, in virtual time",
    "tool": "run one tool call (python in the sandbox, or the calculator) and print its JSON result",
    "train": "RL post-training (GRPO); with no config, a small CPU job",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dynarl {" + ",".join(sorted(COMMANDS)) + "} ...\n\n" + "\n".join(
            f"  {name:<9} {what}" for name, what in sorted(SUMMARIES.items())) +
            "\n\n`dynarl COMMAND --help` for its options.")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"dynarl: unknown command {command!r}; choose from {', '.join(sorted(COMMANDS))}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
