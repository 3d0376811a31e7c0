NUM_GPUS = 0
"""`dynarl bench transport --json` runs end to end (small counts, Ray skipped), prints
one JSON object with every figure (the bare-ZeroMQ floor and the round trip under a flood
too) and the round trip's CPU split, and leaves no process behind."""

import json
import os
import subprocess
import sys
import uuid

from conftest import marked_processes


def test_bench_transport_prints_its_figures_and_reaps_its_workers():
    marker = uuid.uuid4().hex
    env = dict(os.environ, DYNARL_TEST_MARKER=marker)
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "bench", "transport", "--json", "--no-ray",
                             "--rpc-calls", "50", "--small-items", "300", "--mb-items", "4", "--p2p-repeats", "1"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("rpc_rtt_us_p50", "rpc_rtt_us_p99", "rpc_async_rtt_us_p50", "channel_items_per_s", "channel_mb_per_s",
                "p2p_tensor_mb_per_s", "rpc_rtt_us_p99_under_flood", "zmq_floor_rtt_us_p50",
                "zmq_loop_floor_rtt_us_p50"):
        assert out[key] > 0, key
    assert out["rpc_rtt_us_p50"] <= out["rpc_rtt_us_p99"]
    cpu = out["rpc_cpu_us_per_call"]
    assert set(cpu) == {"controller_main", "controller_other_threads", "worker_main", "worker_other_threads"}
    assert cpu["controller_main"] > 0 and cpu["worker_main"] > 0
    assert "ray_rtt_us_p50" not in out and "rtt_speedup_vs_ray" not in out and "zmq_floor_speedup_vs_ray" not in out
    assert marked_processes(marker) == []
