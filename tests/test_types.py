"""The runtime (core/, transport/) and the engine protocols, checked by mypy
(pyproject.toml [tool.mypy]): each role's
Protocol (rollout/base.py RolloutEngine, inference/base.py InferenceEngine,
trainer/engine.py TrainerEngine, threaded.py BlockingTrainer) and the engines that
implement it. engine_factory's typed returns are where mypy proves that every
backend (native, emulated, sglang, vllm, megatron) meets its role's Protocol, and
components/roles.py's where the worker ranks meet the role Protocols core/ calls
them by (core/roles.py).

mypy reads the package as `dynarl`, which is the repository root (package-dir in
pyproject.toml): it runs on a link of that name, from outside the checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra: pip install -e '.[test]')")

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("__init__.py", "components", "core", "transport", "launch")
"""What the checked modules import: the rest of the checkout (tests, docs, runs) stays out of a copy."""


def mypy(source: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m mypy` with the project's config on `source`, a folder that holds the
    package as `dynarl`."""
    env = dict(os.environ, MYPYPATH=str(source.parent))
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(ROOT / ".mypy_cache")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_engines_meet_their_protocols(tmp_path):
    link = tmp_path / "src" / "dynarl"
    link.parent.mkdir()
    link.symlink_to(ROOT, target_is_directory=True)
    done = mypy(link, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


BREAKS = {
    # an engine without one of its role's methods
    "components/rollout/emulated/engine.py": ("    async def export_kv(", "    async def export_kv_blocks("),
    # a report that is a dict again
    "components/trainer/emulated/engine.py": (
        "    async def apply(self) -> TrainMetrics:", "    async def apply(self) -> dict[str, float]:"),
    # a health state that is none of the four
    "core/health.py": ('        return "lost"', '        return "gone"'),
    # a rank that no longer offers a method core/ calls it by (a role Protocol's)
    "components/rollout/worker.py": ("    async def workload_export(self)", "    async def workload_export_all(self)"),
}


def test_a_broken_engine_fails_the_check(tmp_path):
    """The same check on a copy where an engine misses a protocol method, another
    returns a dict for its metrics and rank_health a state that is none of the four:
    mypy must name all three."""
    copy = tmp_path / "src" / "dynarl"
    for name in PACKAGE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, copy / name)
    for path, (old, new) in BREAKS.items():
        text = (copy / path).read_text()
        assert text.count(old) == 1, (path, old)
        (copy / path).write_text(text.replace(old, new))
    done = mypy(copy, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert 'got "EmulatedRolloutEngine", expected "RolloutEngine"' in out, out
    assert "export_kv" in out, out
    assert 'got "EmulatedTrainer", expected "TrainerEngine"' in out, out
    assert "core/health.py" in out and "Literal['gone']" in out, out
    dropped = 'got "tuple[RolloutWorker, RolloutWorker, RolloutWorker]", expected "tuple[MigratableRank'
    assert "roles.py" in out and dropped in out, out
