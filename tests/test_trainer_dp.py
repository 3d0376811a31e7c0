NUM_GPUS = 0
"""Data parallel over gloo: two spawned ranks on a bare ProcessGroupGloo, checked
against a single-process run of the same global batch. The ranks run once per
module (fixture) and write their results as safetensors/JSON for the tests."""

import contextlib
import dataclasses
import io
import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from dynarl.components.trainer.base import STATE_NAMES
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.launch.bench import trainer as bench
from test_trainer import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    flat_params, make_batch, make_config, make_model, one_torch_thread, run_steps)

DP_STEPS, NEXT = [11, 12, 13], 14
DP_CONFIG = dict(eps=1e-4)  # see test_micro_batch_accumulation_equals_one_big_batch


def make_dp_model(seed: int):
    """The tiny model plus an unused 3-element parameter: the flat space gets an odd
    size, so the two ranks own ranges of different lengths (the padded collective
    path), and one parameter never has a gradient."""
    model = make_model(seed)
    model.register_parameter("unused", torch.nn.Parameter(torch.full((3,), 0.5)))
    return model


def _dp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One DP rank, over a bare ProcessGroupGloo (no default group)."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    group = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=300))
    config = make_config(**DP_CONFIG)
    trainer = NativeTrainer(make_dp_model(rank), config, group)  # rank 1's init must be replaced by rank 0's
    metrics = run_steps(trainer, DP_STEPS, rank, world)
    out = {"params": flat_params(trainer)}
    out.update({f"state.{k}": v.clone() for k, v in trainer.export_state_shard().items()})
    trainer.save_checkpoint(os.path.join(out_dir, "ckpt_dp2"))
    # Export, import on fresh ranks over the same group: the next step must be identical.
    fresh = NativeTrainer(make_dp_model(50 + rank), config, group)
    fresh.import_state_shard({k: v.clone() for k, v in trainer.export_state_shard().items()})
    next_batch = make_batch(NEXT).shard(rank, world)
    out["imported_equal"] = torch.tensor([fresh.train_step(next_batch) == trainer.train_step(next_batch)
                                          and torch.equal(flat_params(fresh), flat_params(trainer))])
    # A checkpoint written by one rank, loaded by two (re-sliced), then one more step.
    loaded = NativeTrainer(make_dp_model(70), config, group)
    loaded.load_checkpoint(os.path.join(out_dir, "ckpt_dp1"))
    loaded.train_step(next_batch)
    out["from_dp1_ckpt"] = flat_params(loaded)
    save_file(out, os.path.join(out_dir, f"rank{rank}.safetensors"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump([dataclasses.asdict(m) for m in metrics], f)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dp")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: set up before the per-test thread fixture
    try:
        reference = NativeTrainer(make_dp_model(0), make_config(**DP_CONFIG))
        ref_metrics = run_steps(reference, DP_STEPS)
        ref_state = {k: v.clone() for k, v in reference.export_state_shard().items()}
        ref_params = flat_params(reference)
        reference.save_checkpoint(str(out_dir / "ckpt_dp1"))
        reference.train_step(make_batch(NEXT))
        ref_next_params = flat_params(reference)
    finally:
        torch.set_num_threads(threads)

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dp_worker, args=(r, 2, store.port, str(out_dir))) for r in range(2)]
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 600  # a hang bound
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    ranks = [load_file(str(out_dir / f"rank{r}.safetensors")) if p.exitcode == 0 else None
             for r, p in enumerate(procs)]
    metrics = [json.loads((out_dir / f"rank{r}.json").read_text()) if p.exitcode == 0 else None
               for r, p in enumerate(procs)]
    return dict(procs=procs, seconds=time.monotonic() - started, ranks=ranks, metrics=metrics,
                ref_metrics=ref_metrics, ref_state=ref_state, ref_params=ref_params,
                ref_next_params=ref_next_params, out_dir=out_dir)


def test_dp_workers_exit_cleanly_and_are_reaped(dp_run):
    assert [p.exitcode for p in dp_run["procs"]] == [0, 0]
    for p in dp_run["procs"]:
        assert not p.is_alive()
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)  # joined, so the pid is gone (not a zombie)
    print(f"the ranks ran {dp_run['seconds']:.1f} s")  # no bound: a loaded machine stretches it


def test_dp2_matches_dp1_on_the_same_global_batch(dp_run):
    # Not bitwise: DP=1 sums micro-batch gradients in one order, DP=2 sums each rank's
    # then reduce-scatters; loss sums and the grad norm also add up in other orders.
    # fp32 gradients agree to ~1e-8; with eps=1e-4 the parameters to ~1e-7.
    rank0, rank1 = dp_run["ranks"]
    assert rank0["state.master"].numel() == rank1["state.master"].numel() + 1  # uneven ranges
    assert torch.equal(rank0["params"], rank1["params"])  # replicas identical, bit for bit
    torch.testing.assert_close(rank0["params"], dp_run["ref_params"], rtol=0, atol=1e-6)
    for name in STATE_NAMES:
        joined = torch.cat([rank0[f"state.{name}"], rank1[f"state.{name}"]])
        torch.testing.assert_close(joined, dp_run["ref_state"][name], rtol=0, atol=1e-6)
    assert rank0["state.step"].item() == rank1["state.step"].item() == len(DP_STEPS)
    for m0, m1, ref in zip(*dp_run["metrics"], dp_run["ref_metrics"]):
        assert m0 == m1  # metrics are global: both ranks report the same numbers
        for key, value in dataclasses.asdict(ref).items():
            assert m0[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


def test_dp2_export_import_on_fresh_ranks_gives_identical_next_step(dp_run):
    assert all(r["imported_equal"].item() for r in dp_run["ranks"])


def test_dp1_checkpoint_loads_into_dp2(dp_run):
    for r in dp_run["ranks"]:
        torch.testing.assert_close(r["from_dp1_ckpt"], dp_run["ref_next_params"], rtol=0, atol=1e-6)


def test_dp2_checkpoint_loads_into_dp1_exactly(dp_run):
    trainer = NativeTrainer(make_dp_model(5), make_config(**DP_CONFIG))
    trainer.load_checkpoint(str(dp_run["out_dir"] / "ckpt_dp2"))
    state = trainer.export_state_shard()
    for name in STATE_NAMES:  # re-slicing two shards into one moves bits, never rounds
        assert torch.equal(state[name], torch.cat([r[f"state.{name}"] for r in dp_run["ranks"]]))
    assert torch.equal(flat_params(trainer), dp_run["ranks"][0]["params"])
    assert trainer.global_step == len(DP_STEPS)


def test_bench_runs_and_reports_measured_numbers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench.main(["--json", "--steps", "1", "--batch", "8", "--prompt-len", "4", "--response-len", "8",
                           "--pack-samples", "8", "--pack-max-response", "24", "--pack-max-tokens", "48",
                           "--pack-rounds", "1"])
    assert code == 0
    result = json.loads(out.getvalue())
    for key in ("tokens_per_s_dp1", "tokens_per_s_dp2", "state_export_import_s", "tokens_per_s_padded",
                "tokens_per_s_packed", "packed_speedup"):
        assert result[key] > 0, key
    assert result["state_shard_bytes_per_rank"] >= 4 * 4 * result["params"] // 2  # 4 fp32 states per element
