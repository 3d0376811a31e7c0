"""`dynarl doctor` on CPU devices: the production path (dynarl train on one shared
device, native and megatron, a P2P move onto the same device, decode) in one report."""
import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from dynarl.components.extras import is_available
from conftest import marked_processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def doctor(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def report():
    parts = ["train", "p2p_move", "decode"] + (["train_megatron"] if is_available("megatron") else [])
    marker = uuid.uuid4().hex
    # megatron runs on a CPU only under the tests' CUDA shims (tests/megatron_cpu_site)
    env = dict(os.environ, DYNARL_TEST_MEGATRON_CPU="1", DYNARL_TEST_MARKER=marker)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "megatron_cpu_site"), *sys.path])
    out = doctor("--parts", ",".join(parts), "--json", env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1]), parts, marked_processes(marker)


def test_every_part_passes_on_cpu_devices(report):
    rows, parts, _ = report
    assert rows["device"] == "cpu"
    assert all(rows[p]["ok"] for p in parts), {p: rows[p] for p in parts}


def test_the_train_parts_ran_two_steps_with_a_weight_sync_each(report):
    rows, parts, _ = report
    for part in (p for p in parts if p.startswith("train")):
        assert rows[part]["steps"] == 2
        assert all(b > 0 for b in rows[part]["sync_bytes"])
        # float32 on a CPU: four bytes a parameter of the tiny model, once per step
        assert len(set(rows[part]["sync_bytes"])) == 1


def test_the_move_onto_the_same_device_keeps_the_state(report):
    rows, _, _ = report
    assert rows["p2p_move"]["state_equal"] and rows["p2p_move"]["elements_moved"] > 0


def test_every_process_is_reaped(report):
    assert report[2] == []


def test_bad_requests_are_refused_with_rc_2():
    gpu = doctor("--gpu", timeout=300)
    assert gpu.returncode == 2 and "no CUDA device" in gpu.stderr
    only_gpu = doctor("--parts", "costmodel", timeout=300)
    assert only_gpu.returncode == 2 and "need --gpu" in only_gpu.stderr
    unknown = doctor("--parts", "nope", timeout=300)
    assert unknown.returncode == 2 and "unknown part" in unknown.stderr


def test_wheels_lists_what_a_cuda_torch_image_lacks():
    out = doctor("--wheels", timeout=300)
    assert out.returncode == 0 and "megatron-core==0.16.1" in out.stdout and "torch" not in out.stdout.split()
