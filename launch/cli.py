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
}


def _bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench", description="Run a benchmark; ratios are measured side by side in one run.")
    parser.add_argument("name", choices=sorted(BENCHES))
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(BENCHES[args.name])
    return int(module.main(rest) or 0)


def _train(argv: list[str]) -> int:
    from dynarl.launch.train import main as train_main
    return train_main(argv)


def _tool(argv: list[str]) -> int:
    from dynarl.launch import tool
    return tool.main(argv)


COMMANDS = {
    "bench": _bench,
    "tool": _tool,
    "graph": lambda argv: importlib.import_module("dynarl.launch.graph").main(argv),
    "sim": lambda argv: importlib.import_module("dynarl.launch.sim.cli").main(argv),
    "train": _train,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dynarl {" + ",".join(sorted(COMMANDS)) + "} ...")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"dynarl: unknown command {command!r}; choose from {', '.join(sorted(COMMANDS))}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
