"""`dynarl graph WORKFLOW.py|RUN_DIR [--dot]`: a workflow's hypergraph.

For a workflow file: the static graph, read from the file and the modules it
imports from (the `dynarl` package and files beside it), without running any of
them. For a run directory of `dynarl train`: the runtime graph the scheduler read
at the run's last step (graph.json): each component's workers, devices,
utilization, queued requests and interruptibility, each channel's traffic.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys

from dynarl.core.hypergraph import GRAPH_FILE, Hypergraph
from dynarl.core.hypergraph_extract import extract


def imported_sources(path: str) -> dict[str, str]:
    sources = {path: open(path).read()}
    folder = os.path.dirname(os.path.abspath(path))
    for node in ast.walk(ast.parse(sources[path])):
        if not isinstance(node, ast.ImportFrom) or node.module is None or node.level:
            continue
        beside = os.path.join(folder, *node.module.split(".")) + ".py"
        if os.path.exists(beside):
            sources[beside] = open(beside).read()
        elif node.module.split(".")[0] == "dynarl":
            spec = importlib.util.find_spec(node.module)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                sources[spec.origin] = open(spec.origin).read()
    return sources


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl graph", description=__doc__.splitlines()[0])
    parser.add_argument("workflow", help="a workflow's Python file, or a run directory")
    parser.add_argument("--dot", action="store_true", help="print Graphviz DOT instead of a listing")
    args = parser.parse_args(argv)
    if not os.path.exists(args.workflow):
        print(f"dynarl graph: no such file: {args.workflow}", file=sys.stderr)
        return 2
    if os.path.isdir(args.workflow):
        return _print_saved(os.path.join(args.workflow, GRAPH_FILE), args.dot)
    try:
        graph = Hypergraph(extract(imported_sources(args.workflow)))
    except SyntaxError as exc:
        print(f"dynarl graph: {exc.filename}:{exc.lineno}: {exc.msg}", file=sys.stderr)
        return 2
    print(graph.to_dot() if args.dot else graph.describe())
    return 0


def _print_saved(path: str, dot: bool) -> int:
    if not os.path.exists(path):
        print(f"dynarl graph: {path} does not exist (a run saves it after each step)", file=sys.stderr)
        return 2
    try:
        with open(path) as f:
            graph = Hypergraph.from_wire(json.load(f))
    except (OSError, ValueError) as exc:
        print(f"dynarl graph: {path}: {exc}", file=sys.stderr)
        return 2
    print(graph.to_dot() if dot else graph.describe())
    return 0
