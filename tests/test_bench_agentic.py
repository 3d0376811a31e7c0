NUM_GPUS = 0
"""`dynarl bench agentic --json` runs end to end with small counts and reports both
queue orders side by side from one run."""

import json
import subprocess
import sys


def test_bench_agentic_reports_both_queue_orders():
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "bench", "agentic", "--json",
                             "--episodes", "16", "--warmup-steps", "5", "--repeats", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for mode in ("fifo", "priority"):
        assert out[f"{mode}_turns"] >= 16  # every episode takes at least one turn
        assert out[f"{mode}_requests_per_s"] > 0 and out[f"{mode}_reprefill_tokens"] >= 0
        assert 0 <= out[f"{mode}_reward_mean"] <= 1
    assert out["episodes"] == 16
