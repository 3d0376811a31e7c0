NUM_GPUS = 0
"""`dynarl bench trainer` runs end to end on small arguments and reports measured
numbers: throughput at DP 1, 2, 4, the state each rank holds, padded vs packed, and
activation checkpointing's saved bytes."""

import contextlib
import io
import json

from dynarl.launch.bench import trainer as bench


def test_bench_runs_and_reports_measured_numbers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench.main(["--json", "--steps", "1", "--batch", "8", "--prompt-len", "4", "--response-len", "8",
                           "--pack-samples", "8", "--pack-max-response", "24", "--pack-max-tokens", "48",
                           "--pack-rounds", "1", "--ckpt-seq-len", "64"])
    assert code == 0
    result = json.loads(out.getvalue())
    for key in ("tokens_per_s_dp1", "tokens_per_s_dp2", "tokens_per_s_dp4", "state_export_import_s",
                "tokens_per_s_padded", "tokens_per_s_packed", "packed_speedup", "saved_activation_bytes"):
        assert result[key] > 0, key
    whole = 4 * 4 * result["params"]  # fp32 weights, gradients and two moments
    assert result["state_bytes_per_rank_dp1"] == whole
    for world in (2, 4):  # FSDP2: each rank holds its rows, about 1/N of the whole
        assert whole / world <= result[f"state_bytes_per_rank_dp{world}"] <= whole / world * 1.2, world
    assert result["saved_activation_bytes_checkpointed"] < result["saved_activation_bytes"]
