NUM_GPUS = 0
"""scheduler.policy=dynarl on real runs of `dynarl train` (CPU, 4 logical devices:
rollout 0-2, inference and trainer time-sharing 3): in every step, while rollout
still decodes its long tail, idle rollout engines give their devices to the
trainer (Workload migration out of rollout, P2P resharding into the trainer onto
warm standby ranks), the configured placement comes back before the next step
(P2P back, the parked engines rejoin), and the job trains on exactly the same
samples as the static policy with the same seed.

The move-cost charge is off, the trainer is profiled at its own devices only
(linear beyond), and the tail may be packed 8x denser in KV than the bulk was
(`pack`: these engines fill ~1% of their KV, bound by max_num_seqs, not memory),
and two of the three engines low make a donor (theta 0.6; at 0.8 all three must be,
and this tail lasts ~0.1 s against polls of up to 50 ms on a loaded machine):
this test is about the mechanism (a move in every step's tail),
and whether a move pays off on two shared CPU cores is a measurement, not a
property (test_scheduler_policy.py tests the charge)."""

import json
import os
import subprocess
import sys

import pytest

from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from dynarl.transport.errors import ConfigError
from dynarl.components.workflows.config import load_config
from fakes.sglang_harness import fake_sglang, sglang_workers  # noqa: F401  (fixtures)
from grpo_tiny import overrides

STEPS = 2
JOB = ("runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
       "trainer.num_ranks=1", "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8",
       f"run.steps={STEPS}")
FAST = ("scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
        "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6")


def _children() -> set[int]:
    me, out = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            out.add(int(pid))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for policy in ("static", "dynarl"):
        before = _children()
        run_dir = str(tmp_path_factory.mktemp(policy))
        job = prepare(None, overrides(*JOB, f"scheduler.policy={policy}", *FAST), run_dir, None)
        assert job.run() == 0
        assert _children() <= before, "worker processes left behind"  # spawned, migrated, restored: all reaped
        out[policy] = run_dir
    return out


def _rows(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def test_dynarl_moves_rollout_devices_to_the_barrier_trainer_in_every_step(runs):
    rows = _rows(runs["dynarl"])
    assert [r["step"] for r in rows] == list(range(STEPS))
    # With free moves and a linear profile the policy moves in every step, each time
    # while rollout still decodes (a tail missed by the tick would show as a late move).
    assert all(r["migrations"].get("workload:rollout", 0) >= 1 for r in rows), rows
    assert len(rows[0]["trainer_model"]["profiled"]) == 1
    # what step 0's moves cost (out and back) is what the policy weighs from step 1 on
    assert rows[0]["move_cost_s"] == {"rollout": 0.0, "inference": 0.0, "trainer": 0.0}
    assert rows[1]["move_cost_s"]["trainer"] == pytest.approx(rows[0]["migration_s"]["p2p:trainer"])
    assert rows[1]["move_cost_s"]["rollout"] == pytest.approx(  # (switch: its last engine lent to the barrier)
        sum(rows[0]["migration_s"].get(k, 0.0) for k in ("workload:rollout", "join:rollout", "switch:rollout")))
    for r in rows:
        m = r["migrations"]
        assert r["decisions"] >= 1 and 0 <= r["decision_ms_p50"] <= r["decision_ms_p99"]
        assert set(r["migration_s"]) == set(m) and all(s >= 0 for s in r["migration_s"].values())
        if not m:
            continue
        # (an engine whose generation is over hands nothing over: parking it costs ~0)
        assert r["migration_s"]["workload:rollout"] >= 0 and r["migration_s"]["p2p:trainer"] > 0
        assert m.get("workload:rollout", 0) >= 1, r  # idle engines released their devices
        assert m.get("p2p:trainer", 0) >= 2, r       # the trainer took them, then gave them back
        assert m.get("join:rollout", 0) >= 1, r      # the parked engines rejoined: whole again
        # The trainer steps on the whole batch (a barrier): before generation ends it takes
        # only engines that hold no request, and at the barrier every finished device (the
        # plans below); the release comes before the trainer's receive.
        starts = {}
        for key, at in r["migration_starts_vs_rollout_end_s"]:
            starts.setdefault(key, at)
        assert starts["p2p:trainer"] >= starts["workload:rollout"], r
        assert any(p["moves"] for p in r["plans"]), r
        assert all(p["predicted_s"] < p["current_s"] and p["measured_s"] > 0 for p in r["plans"])
        assert r["weight_version"] == r["step"]  # the rejoined engines received the current policy
        # the device counts after every move: rollout gave engines up, the trainer took
        # them (4 devices in all at every point), and both ended the step at home
        timeline = [counts for _, counts in r["device_counts_vs_rollout_end_s"]]
        assert all(c["rollout"] + c["trainer"] <= 4 for c in timeline), timeline
        assert min(c["rollout"] for c in timeline) < 3 and max(c["trainer"] for c in timeline) > 1, timeline
        assert timeline[-1] == {"rollout": 3, "inference": 1, "trainer": 1}, timeline
        # at the barrier the rollout's last engine, its generation over, lent its device too
        # (inference's is the trainer's own: hybrid), so the trainer stepped on all 4
        # (switch: lent, and taken back at the step's end)
        assert m.get("switch:rollout") == 2 and max(c["trainer"] for c in timeline) == 4, r
        devices = r["devices"]  # the trackers' series: the step's mean, min and max
        assert devices["rollout"]["min"] < devices["rollout"]["mean"] < devices["rollout"]["max"] == 3, devices
        assert devices["trainer"]["min"] == 1 < devices["trainer"]["mean"] < devices["trainer"]["max"], devices
    for r in _rows(runs["static"]):
        assert "migrations" not in r
        assert r["devices"] == {"rollout": {"mean": 3.0, "min": 3.0, "max": 3.0},
                                "trainer": {"mean": 1.0, "min": 1.0, "max": 1.0}}
    trace = json.load(open(os.path.join(runs["dynarl"], "trace.json")))
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"workload rollout step 0", "p2p trainer step 0", "join rollout step 0"} <= names
    # the trainer was resharded onto devices rollout held when the step began (rollout 0-2,
    # trainer 3), and back onto its own
    p2p = [e["args"]["devices"] for e in trace["traceEvents"] if e["name"] == "p2p migration"]
    assert any(set(d) & {0, 1, 2} and 3 in d for d in p2p), p2p
    assert [3] in p2p
    # no process was spawned for a move: every rank the trainer used came from the warm standbys
    tracks = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M"}
    spawned = {tracks[e["pid"]] for e in trace["traceEvents"] if e["name"] == "spawn"}
    assert "trainer~standby" in spawned and not any("@" in g for g in spawned), spawned
    assert os.path.isfile(os.path.join(runs["dynarl"], "timeline.png"))


def test_the_run_saves_the_hypergraph_the_scheduler_read(runs):
    """graph.json: the rollout and trainer nodes as the GlobalScheduler's managers wrote
    them at the last poll (workers, devices, utilization, queued requests), each
    channel's traffic; `dynarl graph RUN_DIR` prints it."""
    with open(os.path.join(runs["dynarl"], "graph.json")) as f:
        saved = json.load(f)
    nodes = {n["name"]: n for n in saved["nodes"]}
    assert nodes["rollout"]["kind"] == "dynamic" and nodes["trainer"]["kind"] == "static"
    # after the last step's restore: the configured placement (rollout 0-2, trainer 3)
    assert sorted(nodes["rollout"]["devices"]) == [0, 1, 2] and nodes["trainer"]["devices"] == [3]
    # utilization as of the last poll, in the tail: of the engines kept then (the rejoined ones are not polled yet)
    assert nodes["rollout"]["utilization"] and set(nodes["rollout"]["utilization"]) < set(nodes["rollout"]["workers"])
    edges = {e["channel"]: e for e in saved["edges"]}
    assert edges["prompts"]["puts"] > 0 and edges["prompts"]["queued"] == 0  # every step's prompts were taken
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", runs["dynarl"]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "rollout" in out.stdout and "dynamic, 3 workers on devices 0-2" in out.stdout
    assert "--[prompts]-->" in out.stdout and "0 waiting" in out.stdout
    missing = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", os.path.dirname(runs["dynarl"])],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "graph.json does not exist" in missing.stderr


def test_static_and_dynarl_train_on_the_same_samples(runs):
    static = read_entries(os.path.join(runs["static"], "ledger.jsonl"))
    dynarl = read_entries(os.path.join(runs["dynarl"], "ledger.jsonl"))
    assert [e.step for e in dynarl] == [e.step for e in static] == list(range(STEPS))
    for s, d in zip(static, dynarl):
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)
    # The engine is batch-invariant, migrated requests continue from their exact state, and the
    # trainer's result does not depend on its DP size (1 or 3 ranks here): the same tokens, every step.
    assert [e.digests for e in dynarl] == [e.digests for e in static]
    assert [r["tokens"] for r in _rows(runs["static"])] == [r["tokens"] for r in _rows(runs["dynarl"])]


@pytest.mark.parametrize("extra, field", [
    (("scheduler.policy=dynarl", "placement.mode=colocated"), "scheduler.policy"),
    (("scheduler.policy=dynarl", "placement.mode=spatial", "rollout.num_ranks=1"), "scheduler.policy"),
    (("scheduler.policy=dynarl", "runtime.cluster.devices_per_node=3", "placement.mode=hybrid",
      "rollout.num_ranks=2", "trainer.num_ranks=1"), "scheduler.policy"),
    (("scheduler.policy=dynarl", "placement.mode=hybrid", "placement.pools=[[rollout, inference], [trainer]]"),
     "scheduler.policy"),
    (("scheduler.dynarl.theta=1.5",), "scheduler.dynarl"),
    (("scheduler.dynarl.interval_s=0",), "scheduler.dynarl"),
    (("scheduler.dynarl.trainer_profile=all",), "scheduler.dynarl.trainer_profile"),
    (("scheduler.dynarl.charge_move_cost=maybe",), "scheduler.dynarl.charge_move_cost"),
    (("scheduler.policy=greedy",), "scheduler.policy"),
])
def test_dynarl_config_errors(extra, field):
    base = [o for o in JOB if not o.startswith(("placement", "rollout.num_ranks", "runtime"))]
    base = ["runtime.cluster.devices_per_node=6", *base] if not any(e.startswith("runtime") for e in extra) else base
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*base, *extra))
    assert str(info.value).startswith(field)


# --- the rollout side of a Workload migration, mid-generation ------------------------
import asyncio  # noqa: E402

import dynarl  # noqa: E402
from dynarl import ClusterConfig, RuntimeConfig  # noqa: E402
from dynarl.components.experience import END  # noqa: E402
from dynarl.components.rollout.worker import RolloutWorker  # noqa: E402
from workload_workers import RefusingRolloutWorker  # noqa: E402
from dynarl.core.migration.workload import workload_migrate  # noqa: E402
from dynarl.components.experience import PromptGroup, Sample

GROUPS, SAMPLES, NEW_TOKENS = 6, 4, 120
"""120 tokens: rank 0's tail outlasts the poll and the migration's first calls on a
loaded machine (at 40, with the native engine's steps ~1 ms, a 2-core host running a
suite and simulations beside it once saw rank 0 finish first: nothing to move)."""
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": NEW_TOKENS, "stop_token_ids": []}


async def _two_engines(ctl, cls=RolloutWorker, backend="native", move_kv=False, kv_choice="always"):
    """Two tiny rollout engines on devices 0 and 1, admitting prompts: native, or
    SGLang's adapter over the fake engine (the `sglang_workers` fixture)."""
    from dynarl.components.model.spec import ModelSpec
    from dynarl.components.rollout.native.config import NativeEngineConfig
    from dynarl.components.rollout.sglang.config import SGLangConfig
    init = {"model": ModelSpec(name="tiny-0.5m"), "engine": NativeEngineConfig(num_blocks=512, max_num_seqs=256),
            "bucket_bytes": 1 << 20, "move_kv": move_kv, "kv_choice": kv_choice}
    if backend == "sglang":
        init.update(backend="sglang", backend_config=SGLangConfig(model_path="fake", abort_retry_s=0.01))
    group = await ctl.spawn(cls, name="rollout", devices=[0, 1], init=init)
    await group.call(RolloutWorker.begin_step)
    return group


async def _generate(migrate: bool, refuse: bool = False, backend: str = "native", move_kv: bool = False,
                    launcher: str = "inproc", cls=RolloutWorker, kv_choice: str = "always"):
    """`refuse`: the kept rank refuses the import, so the migration rolls back. Returns
    the outputs, the groups in emission order, the generate() counters and the
    migration's WorkloadResult (None without one)."""
    config = RuntimeConfig(launcher=launcher, cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        group = await _two_engines(ctl, RefusingRolloutWorker if refuse else cls, backend, move_kv, kv_choice)
        for i in range(GROUPS):
            await ctl.channel("prompts").put(PromptGroup(i, f"p{i}", "", [1, 2 + i, 3],
                                                         [Sample(f"p{i}/{k}", 100 * i + k) for k in range(SAMPLES)]))
        for _ in range(group.world_size):
            await ctl.channel("prompts").put(END)
        generate = asyncio.ensure_future(group.call(RolloutWorker.generate, "prompts", "rollouts", version=-1,
                                                    chunk_size=2, sampling=SAMPLING))
        result = None
        if migrate:
            while True:  # both ranks hold their last prompt and rank 0 is decoding: its long tail
                m = await group.call(RolloutWorker.metrics)
                if all(not r.admitting and r.utilization < 1.0 for r in m) and m[0].running > 0 and m[0].work_done > 0:
                    break
                await asyncio.sleep(0.005)
            if refuse:
                from dynarl.core.migration.p2p import MigrationFailed
                with pytest.raises(MigrationFailed, match="rolled back"):
                    await workload_migrate(ctl, group, [0])
                assert group.world_size == 2
            else:
                result = await workload_migrate(ctl, group, [0])
                assert group.world_size == 1
        stats = await generate
        out: dict[str, list[int]] = {}
        emitted = []
        while len(emitted) < GROUPS:
            for g in await ctl.channel("rollouts").get():
                emitted.append(g.index)
                for s in g.samples:
                    out[s.id] = s.output_ids
        return out, sorted(emitted), stats, result


# sglang: the adapter over tests/fakes' engine (sglang 0.5.23's signatures, its pause
# and abort rules); tokens are a function of the sequence there, so a continued request
# matches an uninterrupted one as on the native engine.


@pytest.fixture
def backend_of(request):
    """The backend parameter, with the SGLang fake installed for 'sglang'."""
    if request.param == "sglang":
        request.getfixturevalue("sglang_workers")
    return request.param


@pytest.mark.parametrize("backend_of", ["native", "sglang"], indirect=True)
async def test_released_rollout_rank_hands_whole_groups_over_mid_generation(backend_of):
    reference, emitted, stats, _ = await _generate(migrate=False, backend=backend_of)
    migrated, emitted_m, stats_m, result = await _generate(migrate=True, backend=backend_of)
    moved = result.moved
    assert moved >= 1  # groups with samples still decoding went to the kept rank
    assert emitted == emitted_m == list(range(GROUPS))  # every group downstream exactly once
    assert migrated == reference  # continued from the exported state: the same tokens
    assert all(len(t) == NEW_TOKENS for t in migrated.values())
    # the released rank's generate() returned its counters; tokens are counted once overall
    assert len(stats_m) == 2 and sum(s.tokens for s in stats_m) == GROUPS * SAMPLES * NEW_TOKENS
    assert sum(s.groups_exported for s in stats_m) == sum(s.groups_imported for s in stats_m) == moved


@pytest.mark.parametrize("backend_of", ["native", "sglang"], indirect=True)
async def test_a_rolled_back_migration_gives_the_real_workers_groups_back(backend_of):
    """The released rank stays open after its export until the migration commits, so
    when the kept rank refuses the import its groups go back to it and finish there."""
    reference, emitted, _, _ = await _generate(migrate=False, backend=backend_of)
    rolled_back, emitted_r, stats_r, _ = await _generate(migrate=True, refuse=True, backend=backend_of)
    assert emitted == emitted_r == list(range(GROUPS))  # every group downstream exactly once
    assert rolled_back == reference
    assert sum(s.tokens for s in stats_r) == GROUPS * SAMPLES * NEW_TOKENS


@pytest.mark.parametrize("launcher", ["inproc", "local"])
async def test_moved_groups_carry_their_kv_and_the_kept_rank_re_prefills_less(launcher):
    """rollout.move_kv: the released rank's requests travel with their computed KV (with
    worker processes, fetched by the kept rank straight from the released one: the data
    plane); the kept engine's prefix cache serves it, so only each request's last
    partial block is computed again, and the tokens are the unmoved run's."""
    reference, _, _, _ = await _generate(migrate=False)
    plain, _, stats_plain, result_plain = await _generate(migrate=True)
    # a bound that catches a hang (seen once under load with worker processes, undiagnosed):
    # the run takes seconds
    with_kv, emitted, stats_kv, result = await asyncio.wait_for(
        _generate(migrate=True, move_kv=True, launcher=launcher), 600)
    moved, moved_plain = result.moved, result_plain.moved
    assert moved >= 1 and moved_plain >= 1 and emitted == list(range(GROUPS))
    taken = result.taken  # every request that offered KV moved it (kv_choice "always")
    assert taken.kv_requests > 0 and taken.kv_tokens > 0 and taken.reprefilled == 0 and taken.kv_s > 0
    assert result_plain.taken.kv_requests == result_plain.taken.kv_tokens == 0
    fetched = sum(s.kv_fetched for s in stats_kv)
    assert sum(s.kv_lost for s in stats_kv) == 0
    assert fetched == (taken.kv_requests if launcher == "local" else 0)  # inproc: no data plane, inline
    assert with_kv == plain == reference
    per_request = {"plain": sum(s.reprefill_tokens for s in stats_plain) / (moved_plain * SAMPLES),
                   "kv": sum(s.reprefill_tokens for s in stats_kv) / (moved * SAMPLES)}
    # with the KV, under one block (16 tokens) each; without, prompt and every token so far
    assert per_request["kv"] < min(16, per_request["plain"]), per_request


async def test_the_taker_prefills_again_where_moving_the_kv_costs_it_more():
    """kv_choice "cost": a kept rank whose measured KV transfers cost more than its
    measured prefill leaves every offered request to be prefilled again (counted per
    migration, nothing fetched), and the tokens are still the unmoved run's."""
    from workload_workers import SlowLinkRolloutWorker
    reference, _, _, _ = await _generate(migrate=False)
    out, emitted, stats, result = await _generate(migrate=True, move_kv=True, cls=SlowLinkRolloutWorker,
                                                  kv_choice="cost", launcher="local")
    from dynarl.components.rollout.worker import PROBE_EVERY
    taken = result.taken
    assert emitted == list(range(GROUPS)) and out == reference
    assert taken.reprefilled >= result.moved >= 1
    # only the probes (every PROBE_EVERY-th request declined) moved their KV, to measure the link again
    assert taken.kv_requests == (taken.reprefilled + taken.kv_requests) // PROBE_EVERY
    assert sum(s.kv_fetched for s in stats) == taken.kv_requests
    # a rank with no such history measures its link on the first move and keeps moving KV
    _, _, _, result = await _generate(migrate=True, move_kv=True, kv_choice="cost", launcher="local")
    assert result.taken.kv_requests >= 1


async def test_an_sglang_export_that_fails_midway_rolls_back_and_loses_nothing(sglang_workers):
    """Released engine 0's abort-all reaches one request, then fails: the request SGLang
    already aborted goes back into that engine with its tokens so far, the migration
    rolls back, and every group reaches downstream once with an uninterrupted run's tokens."""
    from fakes.sglang_harness import broken_abort
    reference, emitted, _, _ = await _generate(migrate=False, backend="sglang")
    broken_abort.add(len(sglang_workers))  # the next run's engine at device 0: the one released
    rolled_back, emitted_r, stats_r, _ = await _generate(migrate=True, refuse=True, backend="sglang")
    assert emitted == emitted_r == list(range(GROUPS))
    assert rolled_back == reference
    assert sum(s.groups_exported for s in stats_r) == 0


async def test_a_released_sglang_engine_frees_its_kv_until_it_rejoins(sglang_workers):
    """The trainer that gets a released engine's device needs its memory: the parked
    SGLang engine has released its KV cache and CUDA graphs (its weights stay, as under
    device_lock), and takes them back, then resumes, when it rejoins the rollout."""
    from dynarl.core.migration.standby import StandbyPool
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        group = await _two_engines(ctl, backend="sglang")
        tm = {h.spec.devices[0]: sglang_workers[i] for i, h in enumerate(group.handles)}
        pool = StandbyPool(ctl, RolloutWorker, "rollout", dict(group.handles[0].spec.init_kwargs))
        await ctl.channel("prompts").put(END)
        await ctl.channel("prompts").put(END)
        await group.call(RolloutWorker.generate, "prompts", "rollouts", version=-1, chunk_size=1, sampling=SAMPLING)
        assert tm[0].released == tm[1].released == set()
        result = await workload_migrate(ctl, group, [0], park=pool)
        assert result.freed_devices == [0] and group.devices == [1]
        assert tm[0].released == {"kv_cache", "cuda_graph"} and tm[1].released == set()
        pool.join(group, [0])
        await group.on([group.devices.index(0)]).call(RolloutWorker.workload_resume)
        assert tm[0].released == set() and not tm[0].is_pause
        await group.call(RolloutWorker.begin_step)
        await ctl.channel("prompts").put(PromptGroup(0, "p0", "", [1, 2, 3], [Sample("p0/0", 1)]))
        for _ in range(2):
            await ctl.channel("prompts").put(END)
        stats = await group.call(RolloutWorker.generate, "prompts", "rollouts", version=-1, chunk_size=1, sampling=SAMPLING)
        assert sum(s.groups for s in stats) == 1  # the rejoined engine serves again


async def test_no_release_while_a_released_rank_generates_and_no_kept_one_does():
    """A rank whose generation is over cannot take exported work (nor could a released
    rank take it back): that migration refuses before it touches anything. Once every
    rank is done, releasing one hands nothing over and just frees its device."""
    from dynarl.core.migration.p2p import MigrationFailed
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        group = await _two_engines(ctl)
        await ctl.channel("prompts").put(END)  # rank 1, alone on the channel, ends at once
        sampling = {**SAMPLING, "max_new_tokens": 120}
        done = await group.on([1]).call(RolloutWorker.generate, "prompts", "rollouts", version=-1, chunk_size=1,
                                        sampling=sampling)
        assert done[0].groups == 0
        await ctl.channel("prompts").put(PromptGroup(0, "p0", "", [1, 2, 3], [Sample("p0/0", 1), Sample("p0/1", 2)]))
        await ctl.channel("prompts").put(END)
        busy = asyncio.ensure_future(group.on([0]).call(RolloutWorker.generate, "prompts", "rollouts", version=-1,
                                                        chunk_size=1, sampling=sampling))
        while (await group.on([0]).call(RolloutWorker.metrics))[0].work_done == 0:
            await asyncio.sleep(0.005)
        with pytest.raises(MigrationFailed, match="no kept rank can take work"):
            await workload_migrate(ctl, group, [0])  # rank 0 decodes; kept rank 1 is over
        assert group.world_size == 2 and group.devices == [0, 1]  # nothing moved
        stats = await busy  # and rank 0 finishes its work undisturbed
        assert stats[0].groups == 1 and stats[0].groups_exported == 0
        result = await workload_migrate(ctl, group, [0])  # now both are done
        assert result.moved == 0 and result.freed_devices == [0] and group.devices == [1]


def test_the_agentic_workflow_moves_devices_in_dynarl_train_too(tmp_path):
    """The one scheduler on the agentic workflow (ReAct episodes, the calculator tool):
    rollout engines serving turns are released (their turns, tokens so far, move to the
    kept engines; the episode driver stops routing to them) and the trainer reshards
    onto their devices, as `dynarl sim` does with scripted episodes; every episode is
    trained once per step and every process is reaped."""
    from conftest import assert_reaped
    run_dir = str(tmp_path / "run")
    import yaml
    args = ("run.steps=2", "run.prompts_per_step=8", "trainer.warmup.steps=2", "runtime.cluster.devices_per_node=4",
            "placement.mode=hybrid", "rollout.num_ranks=3", "scheduler.policy=dynarl", *FAST)
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "agentic.yaml")
    job = prepare(example, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)], run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer) for p in group.pids])
    rows = _rows(run_dir)
    assert any(r["migrations"].get("workload:rollout") and r["migrations"].get("p2p:trainer") for r in rows), rows
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1]
    for e in entries:
        assert len(e.sample_ids) == len(set(e.sample_ids)) == 8 * 8  # prompts x the example's samples, once each
