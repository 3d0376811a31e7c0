"""`dynarl tool`: the tool component from the shell, one call per run.

    dynarl tool python 'print(6 * 7)'
    {"ok": true, "stdout": "42\\n", "error": null}
    echo 'print(6 * 7)' | dynarl tool python - --timeout 5      (- or no code: read stdin)
    dynarl tool calculator '2 ** 10 / 4'

Prints one JSON object. Exit status: 0 ok, 1 the code or expression failed (the
JSON says how), 2 no sandbox (bubblewrap missing or not isolating) or bad usage.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dynarl.components.tools import PythonSandbox, SandboxUnavailable, ToolConfig, ToolResult, calculate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl tool", description="Run one tool call and print its JSON result.")
    tools = parser.add_subparsers(dest="tool", required=True)
    python = tools.add_parser("python", help="run Python code (the argument, or stdin) in the sandbox",
                              description="Run Python code in the sandbox (bubblewrap) and print its JSON result.")
    python.add_argument("code", nargs="?", default="-",
                        help="the code, e.g. 'print(1+1)'; '-' or none: read it from stdin")
    python.add_argument("--timeout", type=float, default=ToolConfig().timeout_s,
                        help=f"wall-clock seconds (default {ToolConfig().timeout_s:g})")
    calculator = tools.add_parser("calculator", help="evaluate arithmetic (the argument, or stdin)")
    calculator.add_argument("expression", nargs="?", help="e.g. '2 ** 10 / 4'; '-' or none: read it from stdin")
    args = parser.parse_args(argv)
    if args.tool == "calculator":
        expression = _read_stdin("expression") if args.expression in (None, "-") else args.expression
        return _print(calculate(expression))
    try:
        config = ToolConfig(timeout_s=args.timeout)
    except ValueError as exc:
        parser.error(f"--timeout: {exc}")
    code = _read_stdin("code") if args.code == "-" else args.code
    try:
        result = asyncio.run(_run_python(config, code))
    except SandboxUnavailable as exc:
        _print(ToolResult(ok=False, stdout="", error=f"sandbox unavailable: {exc}"))
        return 2
    return _print(result)


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():  # (else a bare `dynarl tool python` seems to hang)
        print(f"dynarl tool: reading the {what} from stdin (end with Ctrl-D), or give it as an argument",
              file=sys.stderr)
    return sys.stdin.read()


async def _run_python(config: ToolConfig, code: str) -> ToolResult:
    sandbox = PythonSandbox(config)
    try:
        return await sandbox.run(code)
    finally:
        sandbox.close()


def _print(result: ToolResult) -> int:
    print(json.dumps({"ok": result.ok, "stdout": result.stdout, "error": result.error}))
    return 0 if result.ok else 1
