NUM_GPUS = 0

import json
import subprocess
import sys

CLI = [sys.executable, "-m", "dynarl.launch.cli", "tool"]


def run_cli(args, stdin=""):
    done = subprocess.run(CLI + args, input=stdin, capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_python_round_trip():
    rc, out, _ = run_cli(["python", "--timeout", "5"], "import sys\nprint(sum(range(10)))\nprint('é')")
    assert (rc, out) == (0, {"ok": True, "stdout": "45\né\n", "error": None})


def test_python_error_and_timeout():
    rc, out, _ = run_cli(["python"], "import socket\nsocket.create_connection(('127.0.0.1', 1))")
    assert (rc, out) == (1, {"ok": False, "stdout": "", "error": "forbidden: no network"})
    rc, out, _ = run_cli(["python", "--timeout", "1"], "import time\nprint('started', flush=True)\ntime.sleep(30)")
    assert (rc, out) == (1, {"ok": False, "stdout": "started\n", "error": "timeout after 1.0 s"})


def test_python_without_bwrap_refuses(tmp_path):
    # The CLI has no --bwrap flag; an empty PATH leaves the sandbox without bubblewrap.
    done = subprocess.run(CLI + ["python"], input="print(1)", capture_output=True, text=True, timeout=300,
                          env={"PATH": str(tmp_path)})
    out = json.loads(done.stdout)
    assert done.returncode == 2 and not out["ok"]
    assert out["error"].startswith("sandbox unavailable: bubblewrap not found")


def test_calculator_round_trip():
    rc, out, _ = run_cli(["calculator", "2 ** 10 / 4"])
    assert (rc, out) == (0, {"ok": True, "stdout": "256", "error": None})
    rc, out, _ = run_cli(["calculator"], "__import__('os')")
    assert rc == 1 and out["error"] == "not arithmetic: calling __import__() is not allowed"


def test_python_takes_the_code_as_an_argument_or_stdin_with_a_dash():
    rc, out, _ = run_cli(["python", "print(1+1)"])
    assert (rc, out) == (0, {"ok": True, "stdout": "2\n", "error": None})
    rc, out, _ = run_cli(["python", "print(2+2)", "--timeout", "5"], stdin="print('not read')")
    assert (rc, out) == (0, {"ok": True, "stdout": "4\n", "error": None})
    rc, out, _ = run_cli(["python", "-"], "print(3+3)")
    assert (rc, out) == (0, {"ok": True, "stdout": "6\n", "error": None})


def test_python_help_says_where_the_code_comes_from():
    done = subprocess.run(CLI + ["python", "--help"], capture_output=True, text=True, timeout=300)
    help_text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "the code, e.g. 'print(1+1)'; '-' or none: read it from stdin" in help_text
