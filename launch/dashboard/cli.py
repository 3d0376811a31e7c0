"""`dynarl dashboard RUN_DIR [--port N] [--host ADDRESS]`: the live dashboard of a run
directory, running or finished, served until Ctrl-C. It only reads the directory (the
run's metrics.jsonl, spans.jsonl, samples_text.jsonl, config.yaml), so it may watch a
run that `dynarl train` is training, from another process. Its address, with a new
token in it, is printed at start."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

from dynarl.launch.dashboard.server import DashboardServer


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dynarl dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a `dynarl train` run directory")
    parser.add_argument("--port", type=int, default=0, help="the port (default 0: a free one, printed)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to bind, only it (default 127.0.0.1: this machine only)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not os.path.isfile(os.path.join(args.run_dir, "config.yaml")):
        print(f"dynarl dashboard: error: {args.run_dir} is not a run directory (no config.yaml)", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"dynarl dashboard: error: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(DashboardServer(args.run_dir, host=args.host, port=args.port)))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:  # the port in use, an address not on this machine
        print(f"dynarl dashboard: error: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


async def serve(server: DashboardServer) -> None:
    await server.start()
    print(f"dashboard of {server.run_dir}: {server.url}  (Ctrl-C stops it)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
