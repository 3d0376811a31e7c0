"""`dynarl bench rollout --backends native,vllm,sglang`: the rollout engines side by side.

Each backend generates the same workload (the tiny Qwen2 of `--model` with the same
seed, the same prompts, the same per-request output lengths forced through
max_new_tokens with no stop token, the same sampling) through its dynarl adapter (the
RolloutEngine protocol, built by make_rollout_engine). vLLM and SGLang cannot share
one venv with dynarl's torch, so each backend is measured in a child process
(rollout_child.py) run by an interpreter that imports it: this one if it can, else
`$DYNARL_ENGINE_VENVS/<backend>/bin/python` (default root /root/.cache/dynarl/engines,
built by .ci/engine_<backend>). tok/s is output tokens over the best of `--repeats`
timed generate() calls, after the engine has started (start and the first, warm-up
generate are reported apart).

SGLang on a CPU needs SGLang's CPU kernels (sgl-kernel built from source; PyPI has no
CPU build). Without them the bench refuses SGLang, naming the test-only stand-in a
checkout has (tests/sglang_cpu_site: put it first on PYTHONPATH with
DYNARL_TEST_SGLANG_CPU=1); run with the stand-in, its output says so.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import dynarl

BACKENDS = {"native": "torch", "vllm": "vllm", "sglang": "sglang"}
"""Each backend and the module its interpreter must import (dynarl is this checkout,
put first on the child's PYTHONPATH)."""
BUILT_BY = {"vllm": ".ci/engine_vllm", "sglang": ".ci/engine_sglang"}
DEFAULT_VENVS = "/root/.cache/dynarl/engines"
REPO = os.path.dirname(os.path.abspath(dynarl.__file__))
"""The `dynarl` package the parent runs (in a checkout: its root)."""
STAND_IN_NOTE = ("SGLang's CPU kernels are not installed (PyPI has no CPU build of sgl-kernel): it ran with the "
                 "test-only stand-in tests/sglang_cpu_site, whose sgl_kernel functions raise if called "
                 "(none is, for Qwen2 with torch_native attention)")


class BenchError(Exception):
    """A user-facing problem found before any engine starts (exit status 2)."""


def parse_backends(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise BenchError(f"--backends: no backend given (choose from {', '.join(BACKENDS)})")
    for name in names:
        if name not in BACKENDS:
            raise BenchError(f"--backends: unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    if len(set(names)) != len(names):
        raise BenchError(f"--backends: {text!r} names a backend twice")
    return names


def probe(python: str, module: str) -> str | None:
    """Where `python` would import `module` from (found on its path, not imported); None
    where it cannot."""
    code = "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); print(s.origin if s else '')"
    try:
        out = subprocess.run([python, "-c", code, module], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def is_stand_in(origin: str | None) -> bool:
    return origin is not None and "sglang_cpu_site" in origin


def interpreter(backend: str) -> str:
    """The python that runs `backend`'s child: this one if it imports the backend, else
    the backend's venv. Raises BenchError naming the backend and its build script."""
    module = BACKENDS[backend]
    if probe(sys.executable, module):
        return sys.executable
    root = os.environ.get("DYNARL_ENGINE_VENVS") or DEFAULT_VENVS
    venv = os.path.join(root, backend, "bin", "python")
    build = f"build it with {BUILT_BY.get(backend, 'pip install')}"
    if not os.access(venv, os.X_OK):
        raise BenchError(f"--backends: {backend}: this python cannot import {module} and {venv} does not exist "
                         f"({build}; DYNARL_ENGINE_VENVS sets the root)")
    if not probe(venv, module):
        raise BenchError(f"--backends: {backend}: {venv} cannot import {module} ({build})")
    return venv


def child_env(backend: str, python: str, threads: int, path: str) -> dict[str, str]:
    """The child's environment. `path` (first on PYTHONPATH) holds this checkout as
    `dynarl`, so every child runs the code the parent runs, whatever dynarl its venv
    has installed."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    if backend == "vllm":  # as .ci/engine_vllm runs it
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # its worker's threads: OMP_NUM_THREADS
    if backend == "sglang":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if probe(python, "sgl_kernel") is None:
            raise BenchError(f"--backends: sglang: {python} has no sgl_kernel (SGLang's CPU kernels are a source "
                             "build); a checkout's test-only stand-in: PYTHONPATH=tests/sglang_cpu_site "
                             "DYNARL_TEST_SGLANG_CPU=1")
    return env


def run_child(backend: str, python: str, env: dict[str, str], spec: dict[str, Any], timeout_s: float) -> dict:
    """The child's JSON result; its process group is killed on a timeout or an
    interrupt, and whatever of it is left afterwards too."""
    log = tempfile.NamedTemporaryFile("w+", prefix=f"dynarl-bench-rollout-{backend}-", suffix=".log", delete=False)
    proc = subprocess.Popen([python, "-P", "-m", "dynarl.launch.bench.rollout_child"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, env=env, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(json.dumps({**spec, "backend": backend}), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return {"backend": backend, "error": f"no result in {timeout_s:.0f} s (stopped; log {log.name})"}
    except BaseException:
        kill_group(proc)
        raise
    finally:
        kill_group(proc)
        log.close()
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"backend": backend, "error": f"exit {proc.returncode} with no result: {last_line(log.name)}"}
    if "error" in result:
        result["error"] += f" (log {log.name})"
    else:
        os.unlink(log.name)
    return result


def kill_group(proc: subprocess.Popen, wait_s: float = 10.0) -> None:
    """SIGTERM the child's process group, SIGKILL what is left of it after `wait_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc.poll()  # reap the child itself
        if not group_alive(proc.pid):
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(proc.pid):
                return
            time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running. Zombies do not count: an
    orphan's is reaped by whoever adopted it (or by no one, where init does not reap)."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc: any member, zombies too
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if state != "Z" and int(pgrp) == pgid:
            return True
    return False


def last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1][:300] if lines else "nothing on stderr"


def summary(args: Any, spec: dict[str, Any], results: dict[str, dict]) -> dict[str, Any]:
    lengths = spec["lengths"]
    native = results.get("native", {}).get("tok_s")
    for r in results.values():
        if "tok_s" in r and native:
            r["vs_native"] = r["tok_s"] / native
    return {"model": args.model, "requests": args.requests, "output_tokens": sum(lengths),
            "max_output_len": max(lengths), "median_output_len": sorted(lengths)[len(lengths) // 2],
            "temperature": args.temperature, "threads": args.threads, "repeats": args.repeats, "seed": args.seed,
            "tok_s": {b: r.get("tok_s") for b, r in results.items()},
            "vs_native": {b: r["vs_native"] for b, r in results.items() if "vs_native" in r},
            "backends": results}


def table(result: dict[str, Any]) -> str:
    rows = [f"{result['requests']} requests, {result['output_tokens']} output tokens (median "
            f"{result['median_output_len']}, max {result['max_output_len']}), model {result['model']}, "
            f"temperature {result['temperature']}, {result['threads']} thread(s), best of {result['repeats']}",
            f"{'backend':<8} {'tok/s':>9} {'vs native':>9} {'start s':>8} {'warm-up s':>9}  python"]
    notes = []
    for name, r in result["backends"].items():
        if "error" in r:
            rows.append(f"{name:<8} failed: {r['error']}")
            continue
        ratio = f"{r['vs_native']:.2f}" if "vs_native" in r else "-"
        rows.append(f"{name:<8} {r['tok_s']:>9.1f} {ratio:>9} {r['startup_s']:>8.1f} {r['warmup_s']:>9.2f}  "
                    f"{r['python']}")
        if r.get("note"):
            notes.append(f"{name}: {r['note']}")
    return "\n".join(rows + notes)


def run(args: Any, spec: dict[str, Any]) -> int:
    """The backends of `args.backends` on the workload `spec` (rollout.py backends_workload)."""
    with tempfile.TemporaryDirectory(prefix="dynarl-bench-path-") as path:
        os.symlink(REPO, os.path.join(path, "dynarl"))
        try:
            names = parse_backends(args.backends)
            pythons = {name: interpreter(name) for name in names}
            envs = {name: child_env(name, pythons[name], args.threads, path) for name in names}
        except BenchError as exc:
            print(f"dynarl bench rollout: {exc}", file=sys.stderr)
            return 2
        results = {}
        for name in names:
            results[name] = {**run_child(name, pythons[name], envs[name], spec, args.timeout_s),
                             "python": pythons[name]}
            if is_stand_in(results[name].get("sgl_kernel")):
                results[name]["note"] = STAND_IN_NOTE
    result = summary(args, spec, results)
    print(json.dumps(result) if args.json else table(result))
    return 1 if any("error" in r for r in results.values()) else 0
