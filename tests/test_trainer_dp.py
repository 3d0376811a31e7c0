NUM_GPUS = 0
"""Data parallel on FSDP2 over gloo: spawned ranks (one process each: FSDP2's mesh is
the process's default group) joined as the runtime joins them
(transport/process_group.py), checked against a single-process run of the same global
batch (picotron-style parity), plus DCP checkpoints across DP sizes, export/import and
streaming on two ranks. The ranks run once per module (fixture) and write their
results as safetensors/JSON for the tests."""

import dataclasses
import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from dynarl.components.trainer.native.layout import dim0_rows
from dynarl.components.trainer.native.trainer import NativeTrainer
from test_trainer import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    flat_params, make_batch, make_config, make_model, one_torch_thread, run_steps)
from test_trainer_streaming import parts, with_advantages

DP_STEPS, NEXT = [11, 12, 13], 14
DP_CONFIG = dict(eps=1e-4)  # see test_micro_batch_accumulation_equals_one_big_batch
KINDS = ("param", "exp_avg", "exp_avg_sq")


def make_dp_model(seed: int):
    """The tiny model plus an unused 3-row parameter: FSDP2's dim-0 chunks of it are
    uneven over 2 ranks and empty on a fourth, and it never has a gradient."""
    model = make_model(seed)
    model.register_parameter("unused", torch.nn.Parameter(torch.full((3, 2), 0.5)))
    return model


def full_state(shards: list[dict]) -> dict:
    """The ranks' exported shards joined into whole tensors (Shard(0): rows in rank order)."""
    keys = [k for k in shards[0] if "/" in k]
    return {k: torch.cat([s[k] for s in shards]) for k in keys}


def _join(rank: int, world: int, port: int):
    from dynarl.transport.process_group import join_group
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    return join_group(f"dp{world}", f"dynarl/dp{world}/", rank, world, "127.0.0.1", port, "gloo", 300.0,
                      store=store, secret=b"k" * 32)


def _save(out_dir: str, name: str, tensors: dict, metrics: list | None = None) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, f"{name}.safetensors"))
    if metrics is not None:
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(metrics, f)


def _dp_worker(rank: int, world: int, port: int, out_dir: str, job: str) -> None:
    """One DP rank. "train": the steps, a checkpoint, and (at DP 2) export/import, a
    DP-1 checkpoint's next step and streaming; "resume": load the DP-2 checkpoint."""
    member = _join(rank, world, port)
    config = make_config(**DP_CONFIG)
    trainer = NativeTrainer(make_dp_model(rank), config, member.group)  # rank 1's init is replaced by rank 0's
    nxt = make_batch(NEXT).shard(rank, world)
    if job == "resume":
        trainer.load_checkpoint(os.path.join(out_dir, "ckpt_dp2"))
        out = {f"state.{k}": v.clone() for k, v in trainer.export_state_shard().items()}
        # the same state handed over in memory: the DP-2 writer's shards joined, this rank's rows cut out
        written = full_state([{k.removeprefix("state."): v for k, v in load_file(
            os.path.join(out_dir, f"train2_rank{r}.safetensors")).items() if k.startswith("state.")} for r in range(2)])
        handed = NativeTrainer(make_dp_model(9), config, member.group)
        mine = {k: v[slice(*dim0_rows(v.shape[0], rank, world))] for k, v in written.items()}
        handed.import_state_shard({**mine, "adam_step": out["state.adam_step"], "step": out["state.step"]})
        handed._rng_state = trainer._rng_state  # (the checkpoint's stream for this rank, or a fresh one: the same)
        metrics = dataclasses.asdict(trainer.train_step(nxt))
        out["handed_loss"] = torch.tensor([handed.train_step(nxt).loss], dtype=torch.float64)
        _save(out_dir, f"resume{world}_rank{rank}", {**out, "next_params": flat_params(trainer)}, [metrics])
        return
    metrics = [dataclasses.asdict(m) for m in run_steps(trainer, DP_STEPS, rank, world)]
    out = {"params": flat_params(trainer), **{f"state.{k}": v.clone() for k, v in trainer.export_state_shard().items()}}
    trainer.save_checkpoint(os.path.join(out_dir, f"ckpt_dp{world}"))
    if world == 2:
        fresh = NativeTrainer(make_dp_model(50 + rank), config, member.group)
        fresh.import_state_shard({k: v.clone() for k, v in trainer.export_state_shard().items()})
        same = fresh.train_step(nxt) == trainer.train_step(nxt)
        out["imported_equal"] = torch.tensor([same and torch.equal(flat_params(fresh), flat_params(trainer))])
        loaded = NativeTrainer(make_dp_model(70), config, member.group)
        loaded.load_checkpoint(os.path.join(out_dir, "ckpt_dp1"))
        loaded.train_step(nxt)
        out["from_dp1_ckpt"] = flat_params(loaded)
        # streaming: rank 0 takes three parts, rank 1 one; then rank 0 all and rank 1 none
        batch = with_advantages(make_batch(8, num_groups=4, group_size=2))
        split = [parts(batch, [[0, 1], [2], [7, 3]]), parts(batch, [[4, 5, 6]])]
        for name, mine in (("stream_split", split[rank]), ("stream_one_rank", split[0] + split[1] if rank == 0
                                                          else [])):
            streamed = NativeTrainer(make_model(2), config, member.group)
            streamed.begin_stream()
            for part in mine:
                streamed.accumulate(part)
            streamed.apply()
            out[name] = flat_params(streamed)
    _save(out_dir, f"train{world}_rank{rank}", out, metrics)


def _spawn(out_dir, world: int, job: str) -> tuple[list, float]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dp_worker, args=(r, world, store.port, str(out_dir), job)) for r in range(world)]
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
    return procs, time.monotonic() - started


def _read(out_dir, name: str, world: int) -> tuple[list, list]:
    ranks = [load_file(str(out_dir / f"{name}_rank{r}.safetensors")) for r in range(world)]
    metrics = [json.loads((out_dir / f"{name}_rank{r}.json").read_text()) for r in range(world)]
    return ranks, metrics


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
        streamed = NativeTrainer(make_model(2), make_config(**DP_CONFIG))
        streamed.train_step(with_advantages(make_batch(8, num_groups=4, group_size=2)))
        ref_streamed = flat_params(streamed)
    finally:
        torch.set_num_threads(threads)
    runs = {}
    for world, job in ((2, "train"), (4, "train"), (3, "resume")):
        procs, seconds = _spawn(out_dir, world, job)
        ok = all(p.exitcode == 0 for p in procs)
        runs[(world, job)] = dict(procs=procs, seconds=seconds,
                                  **(dict(zip(("ranks", "metrics"), _read(out_dir, f"{job}{world}", world)))
                                     if ok else {}))
    return dict(runs=runs, ref_metrics=ref_metrics, ref_state=ref_state, ref_params=ref_params,
                ref_next_params=ref_next_params, ref_streamed=ref_streamed, out_dir=out_dir)


def test_dp_workers_exit_cleanly_and_are_reaped(dp_run):
    for run in dp_run["runs"].values():
        assert [p.exitcode for p in run["procs"]] == [0] * len(run["procs"])
        for p in run["procs"]:
            assert not p.is_alive()
            with pytest.raises(ProcessLookupError):
                os.kill(p.pid, 0)  # joined, so the pid is gone (not a zombie)
        print(f"the ranks ran {run['seconds']:.1f} s")  # no bound: a loaded machine stretches it


@pytest.mark.parametrize("world", [2, 4])
def test_dp_matches_the_single_process_reference(dp_run, world):
    # Not bitwise: DP=1 sums micro-batch gradients in one order, DP=N reduce-scatters
    # each rank's; loss sums and the grad norm also add up in other orders. fp32
    # gradients agree to ~1e-8; with eps=1e-4 the parameters to ~1e-7.
    run = dp_run["runs"][(world, "train")]
    ranks = run["ranks"]
    for r in ranks[1:]:
        assert torch.equal(ranks[0]["params"], r["params"])  # the gathered weights agree, bit for bit
    torch.testing.assert_close(ranks[0]["params"], dp_run["ref_params"], rtol=0, atol=1e-6)
    joined = full_state([{k.removeprefix("state."): v for k, v in r.items() if k.startswith("state.")}
                         for r in ranks])
    for key, whole in joined.items():
        torch.testing.assert_close(whole, dp_run["ref_state"][key], rtol=0, atol=1e-6)
    assert {int(r["state.step"]) for r in ranks} == {int(r["state.adam_step"]) for r in ranks} == {len(DP_STEPS)}
    unused = [r["state.param/unused"].shape[0] for r in ranks]
    assert sum(unused) == 3 and (world < 4 or 0 in unused)  # uneven chunks, an empty one at DP 4
    for per_rank in zip(*run["metrics"], dp_run["ref_metrics"]):
        *mine, ref = per_rank
        assert all(m == mine[0] for m in mine)  # metrics are global: every rank reports the same numbers
        for key, value in dataclasses.asdict(ref).items():
            assert mine[0][key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


def test_state_per_rank_falls_as_one_over_n(dp_run):
    whole = sum(v.numel() for k, v in dp_run["ref_state"].items() if "/" in k)
    for world in (2, 4):
        held = [sum(v.numel() for k, v in r.items() if k.startswith("state.") and "/" in k)
                for r in dp_run["runs"][(world, "train")]["ranks"]]
        assert sum(held) == whole and max(held) <= whole / world * 1.2, held


def test_dp2_export_import_on_fresh_ranks_gives_identical_next_step(dp_run):
    assert all(r["imported_equal"].item() for r in dp_run["runs"][(2, "train")]["ranks"])


def test_dp1_checkpoint_loads_into_dp2(dp_run):
    for r in dp_run["runs"][(2, "train")]["ranks"]:
        torch.testing.assert_close(r["from_dp1_ckpt"], dp_run["ref_next_params"], rtol=0, atol=1e-6)


def test_streaming_parts_on_two_ranks_equal_the_whole_batch_on_one(dp_run):
    ranks = dp_run["runs"][(2, "train")]["ranks"]
    for name in ("stream_split", "stream_one_rank"):
        assert torch.equal(ranks[0][name], ranks[1][name])  # replicas agree bitwise
        torch.testing.assert_close(ranks[0][name], dp_run["ref_streamed"], rtol=1e-5, atol=1e-6)


def written_at_dp2(dp_run) -> dict:
    ranks = dp_run["runs"][(2, "train")]["ranks"]
    return full_state([{k.removeprefix("state."): v for k, v in r.items() if k.startswith("state.")} for r in ranks])


def test_a_dp2_checkpoint_resumes_at_dp1_bitwise(dp_run):
    """DCP re-slices the rows: the whole state at DP 1 is the DP-2 writer's, bit for bit,
    and the next step's loss equals that of a DP-1 trainer handed the same state in memory."""
    config = make_config(**DP_CONFIG)
    resumed = NativeTrainer(make_dp_model(5), config)
    resumed.load_checkpoint(str(dp_run["out_dir"] / "ckpt_dp2"))
    state = resumed.export_state_shard()
    written = written_at_dp2(dp_run)
    assert all(torch.equal(state[k], written[k]) for k in written)
    assert resumed.global_step == int(state["adam_step"]) == len(DP_STEPS)
    handed = NativeTrainer(make_dp_model(6), config)
    handed.import_state_shard({**written, "adam_step": state["adam_step"], "step": state["step"]})
    handed._rng_state = resumed._rng_state  # (rank 0's stream, from the checkpoint)
    nxt = make_batch(NEXT)
    assert resumed.train_step(nxt).loss == handed.train_step(nxt).loss
    assert torch.equal(flat_params(resumed), flat_params(handed))


def test_a_dp2_checkpoint_resumes_at_dp3_bitwise(dp_run):
    """At DP 3 the whole state is the DP-2 writer's, bit for bit, and the next step's
    loss equals bitwise that of DP-3 ranks handed the same rows in memory."""
    run = dp_run["runs"][(3, "resume")]
    joined = full_state([{k.removeprefix("state."): v for k, v in r.items() if k.startswith("state.")}
                         for r in run["ranks"]])
    written = written_at_dp2(dp_run)
    assert joined.keys() == written.keys() and all(torch.equal(joined[k], written[k]) for k in written)
    losses = {m[0]["loss"] for m in run["metrics"]}
    assert len(losses) == 1  # one global loss on every rank
    assert {float(r["handed_loss"]) for r in run["ranks"]} == losses  # bitwise: the state handed over in memory
    dp2_next = NativeTrainer(make_dp_model(7), make_config(**DP_CONFIG))
    dp2_next.import_state_shard({**written, "adam_step": torch.tensor([3]), "step": torch.tensor([3])})
    assert losses.pop() == pytest.approx(dp2_next.train_step(make_batch(NEXT)).loss, rel=1e-6)
    for r in run["ranks"][1:]:
        assert torch.equal(r["next_params"], run["ranks"][0]["next_params"])
