"""`dynarl bench rollout --backends`: the native engine measured in a child process, the
errors given before any engine starts (exit status 2, one line naming the flag and the
backend), and a child that outlives its timeout stopped with what it started. The
vLLM and SGLang figures are measured by hand in their venvs (docs/benchmarks.md)."""
import importlib.util
import json
import os
import sys
import time

import pytest

from dynarl.launch.bench import rollout, rollout_backends

NUM_GPUS = 0
SMALL = ["--requests", "4", "--max-len", "8", "--repeats", "1"]


def test_native_runs_in_a_child_and_reports_its_rate(capsys):
    assert rollout.main(["--backends", "native", "--json", *SMALL]) == 0
    result = json.loads(capsys.readouterr().out)
    native = result["backends"]["native"]
    assert native["python"] == sys.executable and native["killed_processes"] == 0
    assert native["tok_s"] == pytest.approx(result["output_tokens"] / min(native["times_s"]))
    assert result["vs_native"] == {"native": 1.0} and result["requests"] == 4


@pytest.mark.parametrize("backends, words", [
    pytest.param("nosuch", ["unknown backend 'nosuch'", "native, vllm, sglang"], id="unknown"),
    pytest.param("native,native", ["names a backend twice"], id="twice"),
    pytest.param(",", ["no backend given"], id="empty"),
])
def test_a_bad_list_is_refused_in_one_line(capsys, backends, words):
    assert rollout.main(["--backends", backends, *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--backends" in err
    for word in words:
        assert word in err


def test_a_backend_with_no_interpreter_names_its_build_script(capsys, monkeypatch, tmp_path):
    if importlib.util.find_spec("vllm") or importlib.util.find_spec("sglang"):
        pytest.skip("this python imports vllm or sglang itself")
    monkeypatch.setenv("DYNARL_ENGINE_VENVS", str(tmp_path))
    (tmp_path / "sglang" / "bin").mkdir(parents=True)
    (tmp_path / "sglang" / "bin" / "python").symlink_to(sys.executable)  # a venv without sglang
    assert rollout.main(["--backends", "native,vllm", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "--backends: vllm:" in err and "does not exist" in err and ".ci/engine_vllm" in err
    assert rollout.main(["--backends", "sglang", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "--backends: sglang:" in err and "cannot import sglang" in err and ".ci/engine_sglang" in err


def test_a_child_past_its_timeout_is_stopped_with_its_processes(tmp_path):
    pids = tmp_path / "pids"
    python = tmp_path / "python"  # stands in for an engine that never answers, with a process of its own
    python.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    python.chmod(0o755)
    start = time.monotonic()
    result = rollout_backends.run_child("vllm", str(python), dict(os.environ), {}, timeout_s=2)
    assert "no result in 2 s" in result["error"] and time.monotonic() - start < 120  # not the child's 300 s
    os.unlink(result["error"].rsplit("log ", 1)[1].rstrip(")"))
    group = int(pids.read_text().split()[0])
    assert not rollout_backends.group_alive(group)
