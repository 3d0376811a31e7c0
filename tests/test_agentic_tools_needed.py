NUM_GPUS = 0
"""What an agentic job's tools need is checked before any worker starts: `py` (the
Python sandbox) needs bubblewrap, and a job whose episodes call only the calculator
(examples/agentic.yaml: agentic.tools [calc]) does not."""

import os
import subprocess
import sys
import time

import pytest
import yaml

import dynarl
from dynarl import ConfigError, RuntimeConfig
from dynarl.components.tools import ToolWorker
from dynarl.components.workflows.config import load_config
from dynarl.launch.train_prepare import check_tools

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "agentic.yaml")


def example(*overrides):
    with open(EXAMPLE) as f:
        return load_config(yaml.safe_load(f), list(overrides))


def test_without_bwrap_a_py_job_is_refused_at_start_in_one_line(tmp_path):
    """PATH without bwrap: exit 2 within seconds, one line naming the field and how to install."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", EXAMPLE, "agentic.tools=[calc,py]",
                             "--run-dir", str(run_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "agentic.tools: 'py' runs model code in the bubblewrap sandbox" in result.stderr
    assert "apt-get install bubblewrap" in result.stderr and "agentic.tools=[calc]" in result.stderr
    assert not run_dir.exists()
    assert time.monotonic() - started < 60


def test_the_calculator_only_example_needs_no_bwrap(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    cfg = example()
    assert cfg.agentic.tools == ["calc"]
    check_tools(cfg)  # no error
    with pytest.raises(ConfigError, match="agentic.tools"):
        check_tools(example(("agentic.tools", ["calc", "py"])))


def test_a_demonstrated_tool_must_be_callable():
    with pytest.raises(ConfigError) as info:
        example(("task.calc.tool", "py"))
    assert info.value.path == "agentic.tools" and "'py'" in str(info.value)
    with pytest.raises(ConfigError, match="agentic.tools"):
        example(("agentic.tools", ["calc", "calc"]))


async def test_a_tool_worker_without_python_starts_without_bwrap():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        tools = await ctl.spawn(ToolWorker, num_ranks=1,
                                init={"config": {"bwrap": "/nonexistent/bwrap"}, "python": False})
        [value] = await tools.call(ToolWorker.calculator, "347*29")
        assert (value.ok, value.stdout) == (True, "10063")
        [off] = await tools.call(ToolWorker.python, "print(1)")
        assert not off.ok and off.error == "tool py is off"
