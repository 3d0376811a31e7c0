"""Runs inside the sandbox, after the lines sandboxed.py puts in front of it:

    SOURCE, FILENAME, MODULE, NAME, BATCHED, TIMEOUT_S, PAYLOAD

(the reward file's text, where it came from, the function's name, the mode, one call's
limit, and the samples as JSON text). So this file may import only the standard library.
It runs the reward file as module MODULE, calls NAME on each sample (or once on all,
BATCHED) and writes one line per sample to the standard output it was started with:

    MARKER {"i": 0, "value": ...} | {"i": 0, "error": "..."} | {"i": 0, "timeout": true}

or, when the file itself fails, MARKER {"load_error": "..."}. The function's own prints
go nowhere (the output is the results' channel). A line is written as soon as its call
ends, so the samples scored before a crash keep their results.
"""
import asyncio
import inspect
import json
import numbers
import os
import signal
import sys
import types

MARKER = "\x1edynarl-reward "
KEYWORDS = ("prompt", "problem_id", "sample_id", "metadata")
BATCH_KEYWORDS = ("prompts", "problem_ids", "sample_ids", "metadata")
SINGULAR = {"prompts": "prompt", "problem_ids": "problem_id", "sample_ids": "sample_id", "metadata": "metadata"}


class CallTimeout(BaseException):
    """One call's time is up (a BaseException: the function's `except Exception` does not catch it)."""


def on_alarm(signum, frame):
    raise CallTimeout()


def emit(out, record):
    os.write(out, (MARKER + json.dumps(record) + "\n").encode("utf-8"))


def plain(value):
    """A return value as JSON can carry it (numbers as floats); TypeError otherwise."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Real):
        return float(value)  # (nan and inf too: JSON's NaN and Infinity, the host words the error)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (hasattr(value, "__len__") and hasattr(value, "__iter__")):
        return [plain(v) for v in value]
    raise TypeError(f"returned a {type(value).__name__}, not a number or a mapping with a 'reward' number")


def keywords_for(fn, names):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return names
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n in names if n in params and params[n].kind in by_name)


def call(loop, fn, args, kwargs):
    """fn's return within TIMEOUT_S; raises CallTimeout past it."""
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                value = loop.run_until_complete(asyncio.wait_for(value, TIMEOUT_S))
            except asyncio.TimeoutError:
                raise CallTimeout() from None
        return value
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def result(index, run):
    """The record of sample `index`'s call `run()`."""
    try:
        value = run()
    except CallTimeout:
        return {"i": index, "timeout": True}
    except Exception as exc:
        return {"i": index, "error": f"{type(exc).__name__}: {exc}"}
    try:
        return {"i": index, "value": plain(value)}
    except TypeError as exc:
        return {"i": index, "error": str(exc)}


def main():
    out = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    module = types.ModuleType(MODULE)
    module.__file__ = FILENAME
    sys.modules[MODULE] = module
    try:
        exec(compile(SOURCE, FILENAME, "exec"), module.__dict__)
        fn = getattr(module, NAME)
    except BaseException as exc:
        emit(out, {"load_error": f"loading {FILENAME} raised {type(exc).__name__}: {exc}"})
        return
    samples = json.loads(PAYLOAD)
    signal.signal(signal.SIGALRM, on_alarm)
    loop = asyncio.new_event_loop()
    if BATCHED:
        kwargs = {k: [s[SINGULAR[k]] for s in samples] for k in keywords_for(fn, BATCH_KEYWORDS)}
        args = ([s["response"] for s in samples], [s["answer"] for s in samples])
        record = result(-1, lambda: call(loop, fn, args, kwargs))
        if "value" in record and isinstance(record["value"], list) and len(record["value"]) == len(samples):
            for i, value in enumerate(record["value"]):
                emit(out, {"i": i, "value": value})
        else:
            emit(out, record)  # (i -1: the one call's outcome, every sample's)
        return
    names = keywords_for(fn, KEYWORDS)
    for i, s in enumerate(samples):
        kwargs = {k: s[k] for k in names}
        emit(out, result(i, lambda: call(loop, fn, (s["response"], s["answer"]), kwargs)))


if __name__ == "__main__":  # (the sandbox's launcher runs it as __main__; importing it runs nothing)
    main()
