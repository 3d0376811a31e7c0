"""`dynarl graph WORKFLOW.py [--dot]`: the static hypergraph of a workflow.

Reads the workflow file and the modules it imports from (the `dynarl` package
and files beside it), without running any of them.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys

from dynarl.core.hypergraph import Hypergraph
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
    parser.add_argument("workflow", help="a workflow's Python file")
    parser.add_argument("--dot", action="store_true", help="print Graphviz DOT instead of a listing")
    args = parser.parse_args(argv)
    if not os.path.exists(args.workflow):
        print(f"dynarl graph: no such file: {args.workflow}", file=sys.stderr)
        return 2
    try:
        graph = Hypergraph(extract(imported_sources(args.workflow)))
    except SyntaxError as exc:
        print(f"dynarl graph: {exc.filename}:{exc.lineno}: {exc.msg}", file=sys.stderr)
        return 2
    print(graph.to_dot() if args.dot else graph.describe())
    return 0
