"""RolloutWorker: one rank of the rollout component, wrapping a rollout engine.

It reads prompt groups from a channel, generates every group's samples with
continuous batching, and puts finished groups downstream in chunks as soon as a
chunk is complete, so the next stage starts while the long tail still decodes.
Weights arrive over a runtime process group (weight_sync.py); the engine's
version is checked before a step generates, so a stale policy never samples.

device_lock: when this rank shares its device (colocated / hybrid placement),
offload frees the KV cache and the prefix cache (`release_memory`), and onload
allocates them again; the weights stay resident, as they must to receive the
next update. On a device of its own the cache simply stays.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import dynarl
from dynarl.components.model.spec import ModelSpec
from dynarl.components.rollout.generation import Generation
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.base import EngineLoad, InflightRequest, KVBlocks
from dynarl.components.rollout.kv_choice import KVCost, KVLinkFit, choose
from dynarl.components.rollout.run_control import Run, Unfinished
from dynarl.components.stale_weights import StaleWeights
from dynarl.components.stage_results import RolloutStats
from dynarl.core.migration.records import Taken, WorkItem
from dynarl.core.scheduler.report import RankReport
from dynarl.transport.wire import RemoteRef


log = logging.getLogger(__name__)

PROBE_EVERY = 16
"""kv_choice "cost": of the requests whose KV the choice leaves, every 16th moves
anyway, so a link measured once as slow (a first connection, a busy moment) is
measured again and the choice can turn back."""

class RolloutWorker(dynarl.Worker):
    def __init__(self, model: ModelSpec, engine: NativeEngineConfig, bucket_bytes: int, shares_device: bool = False,
                 backend: str = "native", backend_config: Any = None, move_kv: bool = False,
                 kv_choice: str = "cost") -> None:
        """`backend_config`: the SGLangConfig or EmulatedRolloutConfig of those backends;
        `move_kv`: exported requests offer their KV (rollout.move_kv); `kv_choice`: a
        rank taking them in moves each one's KV when that costs less than prefilling it
        again ("cost", kv_choice.py), or always ("always")."""
        from dynarl.components.engine_factory import make_rollout_engine, weights_template
        # engine_factory picks the backend; -1: no policy weights until the first sync
        self.engine = make_rollout_engine(backend, model, engine, backend_config, weight_version=-1,
                                          device=self.device)
        # weight_sync plans its buckets (and their dtype) from it
        self.weights_template = weights_template(self.engine, model, self.device_kind)
        self.bucket_bytes = bucket_bytes
        self.shares_device = shares_device
        self.move_kv = move_kv
        if kv_choice not in ("cost", "always"):
            raise ValueError(f"kv_choice must be 'cost' or 'always', got {kv_choice!r}")
        self.kv_choice = kv_choice
        self.offered: list[Any] = []
        """KV offered for the last export's items (RemoteRefs), until commit or resume."""
        self.kv_fetched = self.kv_lost = 0
        """Requests whose KV came peer-to-peer, and whose KV could not be fetched."""
        self.kv_links = {False: KVLinkFit(), True: KVLinkFit()}
        """What taking KV in cost this rank, within its node and across nodes (loop seconds)."""
        self.kv_declined = 0
        """Requests whose KV this rank chose not to move (every PROBE_EVERY-th moves anyway)."""
        self.frees_released = backend != "emulated"
        """A rank a Workload migration releases frees its KV memory for the component that
        gets its devices (emulated devices: MoveCosts charges that, core/migration/mover.py)."""
        self.run: Run | None = None
        """The step's run while `generate` (or serve_turns) runs (the scheduler's view and moves)."""
        self.admitting = False
        """Between `begin_step` and this rank taking its END: it may still get prompts."""
        self.tokens_done = 0
        """Tokens of finished requests, all steps (work_done adds those decoded so far)."""
        self.freed = False
        """The engine's KV memory is released: by device_lock (offload) or because the rank
        was released by a Workload migration (its devices go to another component)."""

    async def setup(self) -> None:
        if self.shares_device:
            await self._free()  # starts off the device; onload brings the cache

    async def teardown(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)  # sglang: its scheduler processes
        if shutdown is not None:
            shutdown()

    async def onload(self) -> None:
        if self.shares_device:
            await self._take_back()

    async def offload(self) -> None:
        if self.shares_device:
            await self._free()

    async def release_devices(self) -> None:
        """Its generation is over for the step and its devices go to the barrier stage
        (core/migration/mover.py): the engine frees its memory; it stays in its group."""
        await self._free()

    async def reclaim_devices(self) -> None:
        """The step is over: the devices are back, and so is the engine's memory."""
        await self._take_back()

    async def _free(self) -> None:
        if not self.freed:
            await self.engine.release_memory()
            self.freed = True

    async def _take_back(self) -> None:
        if self.freed:
            await self.engine.resume_memory()
            self.freed = False

    def weight_version(self) -> int:
        """The policy version this rank's engine holds (-1: none yet)."""
        return self.engine.weight_version

    async def receive_weights(self, group: str, version: int) -> int:
        # each bucket goes into the engine as it arrives (the engine holds one bucket more, not a model)
        from dynarl.components import weight_sync
        await weight_sync.receive_async(self.process_group(group), self.weights_template, self.bucket_bytes,
                                        self.engine.weight_version, version, self.engine.update_weights, self.device)
        return version

    # --- the scheduler's view (core/scheduler/manager.py) ---------------------------
    def begin_step(self) -> None:
        """Called before the step's prompts flow: this rank is admitting again."""
        self.admitting = True

    async def metrics(self) -> RankReport:
        """Its KV fill and the raw numbers a view of the tail is made of: its requests,
        active and total KV tokens, the tokens the held requests made so far, the
        requests finished in this step's generation with their tokens (no oracle
        lengths), its mean engine step so far (the predictor's decode step on real
        engines), and what a token of a request moved here costs it (its prefill, or
        with move_kv the KV's transfer: the policy's moved_requests_s). A rank that may
        still be handed prompts (`admitting`: it has not taken its END) is not in the
        long tail and is never a donor: a released rank has always consumed its END,
        and the kept ranks see every remaining prompt and their own ENDs."""
        load = await self.engine.load()
        run = self.run
        return RankReport(
            utilization=load.utilization, admitting=self.admitting, running=load.num_running,
            waiting=load.num_waiting, kv=load.active_kv_tokens, capacity=load.kv_capacity_tokens,
            generated=load.generated_tokens, finished=run.num_finished if run is not None else 0,
            finished_tokens=run.finished_tokens if run is not None else 0,
            active_run=run is not None and not run.control.closed,
            step_s=run.mean_step_s() if run is not None else 0.0, moved_token_s=self._moved_token_s(load),
            work_done=float(self.tokens_done + (load.generated_tokens + run.num_tokens if run is not None else 0)))

    def _moved_token_s(self, load: EngineLoad) -> float:
        """What a token of a request moved here costs (the policy's moved_requests_s): its
        prefill, or with move_kv its KV's transfer across nodes (the worse case), the
        cheaper of the two with kv_choice "cost"; 0: not known."""
        if not self.move_kv:
            return load.prefill_s_per_token
        cost = self._kv_cost(load, across=True)
        kv = cost.per_token_s if cost is not None else 0.0
        if self.kv_choice == "cost" and kv > 0 and load.prefill_s_per_token > 0:
            return min(kv, load.prefill_s_per_token)
        return kv

    # --- Workload migration (core/migration/workload.py) ---------------------------
    async def workload_pause(self) -> None:
        """Stops this rank's generation at an engine-step boundary."""
        if self.admitting:
            raise RuntimeError("workload_pause: this rank may still be handed prompts")
        if self.run is not None and not self.run.control.closed:  # else its generation is over: nothing to hand over
            await self.run.pause()

    async def workload_export(self) -> list[WorkItem]:
        """Whole groups with samples still generating here: their finished samples
        stay in the group, their unfinished requests travel as in-flight state.
        The rank's generate() emits what it finished and returns at workload_commit."""
        run = self.run
        if run is None or not run.control.paused:  # was over when paused: nothing to hand over
            return []
        items = await run.export()
        run.control.go("hold")  # open until the migration commits (or gives the items back)
        if self.move_kv:
            for item in items:
                await self._attach_kv(item)
        return [WorkItem(item.id, item.weight, item) for item in items]

    async def _attach_kv(self, item: Unfinished) -> None:
        """rollout.move_kv: the KV the engine still holds for each of the item's requests
        (their tokens so far), offered one request at a time (the taker chooses per
        request), as item.kv; and the node it leaves from."""
        offers = [await self._offer_kv(r, self.offered) for r in item.inflight]
        item.kv, item.node = [offer for offer in offers if offer is not None], self.node

    async def _offer_kv(self, request: InflightRequest, offers: list[Any]) -> list | None:
        """The KV the engine holds for `request` as [tokens, KV or its RemoteRef] (offered:
        the taker fetches it from here, not via the controller; the ref kept in
        `offers`); None if it holds none."""
        blocks = await self.engine.export_kv(request)
        if blocks is None:
            return None
        wire = blocks.to_wire()
        ref = self.offer(wire)
        if ref is not None:
            offers.append(ref)
        return [len(blocks.token_ids), wire if ref is None else ref]

    def _withdraw(self, offers: list[Any]) -> None:
        """Drops these offers (fetched by now, or never to be)."""
        for ref in offers:
            self.withdraw(ref)
        offers.clear()

    async def workload_commit(self) -> None:
        """The kept ranks have the exported work: this rank's generate() emits what it
        finished and returns (waited for, so its counters are in before it stops); then
        its engine frees its KV memory, as the devices go to another component."""
        run = self.run
        if run is not None and run.control.handed_off:
            run.control.let_go()
            await run.control.finished.wait()
        self._withdraw(self.offered)
        if self.frees_released:
            try:
                await self._free()
            except Exception as exc:  # the engine kept its memory and still serves if it rejoins
                log.warning("rollout rank %d, released: its engine could not free its KV memory: %r", self.rank, exc)

    async def workload_load(self) -> float:
        """In the unit of the exported items' weights: the tokens the held requests made
        so far (a request's expected remaining work grows with them), plus one each."""
        if self.run is None or self.run.control.closed:
            return float("inf")  # generation over: takes work only if no rank can (then import fails)
        self.run.control.go("hold")  # a kept rank: its generate() waits for the import before it may return
        load = await self.engine.load()
        return float(load.generated_tokens + load.num_running + load.num_waiting)

    async def workload_import(self, work: list[WorkItem]) -> Taken:
        """Takes the items over; returns what it took: per request with KV on offer, the
        KV moved (fetched and installed, its measured cost) or left to be prefilled
        again here (the cheaper choice, or its KV could not be fetched)."""
        items: list[Unfinished] = [w.body for w in work]
        taken = Taken(len(items))
        load = await self.engine.load()
        # the KV first: the run stays held (workload_load) while it is fetched
        kvs = [await self._kv_in(item.kv, self._across(item.node), load, taken, item.id) for item in items]
        if self.run is not None:
            self.run.control.let_go()
        if not items:
            return taken
        if self.run is None or self.run.control.closed:
            raise RuntimeError("workload_import: this rank has no generation to take work into")
        for item, blocks in zip(items, kvs):  # first: the engine's prefix cache then serves the moved prefixes
            await self._install(blocks, self._across(item.node), taken)
        self.run.adopt(items)
        return taken

    def _across(self, node: int | None) -> bool:
        """KV from `node` (None: not said) comes across nodes."""
        return node is not None and node != self.node

    async def _install(self, blocks: list[tuple[KVBlocks, float]], across: bool, taken: Taken) -> None:
        """Into the engine, each with its measured cost (its fetch, plus the engine's
        import), which this link's fit learns from, per token that came (installed or
        already cached here). An import the engine refuses (other weights, no room) or
        does not need (all cached) installs nothing: the engine's own counters (kv_refused,
        reprefill_tokens) show what it computed again."""
        if not blocks:
            return
        before = (await self.engine.load()).kv_import_s
        for kv, fetch_s in blocks:
            installed = self.engine.import_kv(kv, across_nodes=across)
            after = (await self.engine.load()).kv_import_s  # one load() per import: it is the next one's before
            seconds, before = fetch_s + after - before, after
            self.kv_links[across].add(len(kv.token_ids), seconds)
            if installed:
                taken.moved(installed, seconds)

    def _kv_cost(self, load: EngineLoad, across: bool) -> KVCost | None:
        """Taking KV in, as measured here, else the engine's own per-token figure, else unknown."""
        measured = self.kv_links[across].cost()
        if measured is not None:
            return measured
        return KVCost(0.0, load.kv_move_s_per_token) if load.kv_move_s_per_token > 0 else None

    async def _kv_in(self, offers: list, across: bool, load: EngineLoad, taken: Taken,
                     what: str) -> list[tuple[KVBlocks, float]]:
        """The KV that came with an item (`what`), per request: inline, or offered by the released
        rank and fetched straight from it (the data plane), with the seconds its fetch
        took; only where moving it is the cheaper choice (kv_choice). KV that is not
        taken, or cannot be fetched, is not needed for correctness: its request is
        prefilled again (counted; a failed fetch is logged)."""
        loop = asyncio.get_running_loop()
        wanted = []
        for tokens, kv in offers:
            if self.kv_choice == "cost" and not choose(tokens, self._kv_cost(load, across), load.prefill_s_per_token):
                self.kv_declined += 1
                if self.kv_declined % PROBE_EVERY:  # else moved anyway: the link is measured again
                    taken.reprefilled += 1
                    continue
            wanted.append(kv)

        async def take(kv: Any) -> tuple[KVBlocks, float] | None:
            begun = loop.time()
            if isinstance(kv, RemoteRef):
                try:
                    kv = await self.fetch(kv)
                except Exception as exc:  # PayloadLost, or the rank is gone: re-prefill instead
                    log.warning("rollout rank %d: the KV of %s could not be fetched, re-prefilling: %r",
                                self.rank, what, exc)
                    self.kv_lost += 1
                    taken.reprefilled += 1
                    return None
                self.kv_fetched += 1
            return KVBlocks.from_wire(kv), loop.time() - begun
        return [x for x in await asyncio.gather(*(take(kv) for kv in wanted)) if x is not None]

    async def workload_resume(self) -> None:
        self._withdraw(self.offered)  # a rolled-back move: what it got back came with its KV or is re-prefilled
        if self.run is not None:
            await self.run.resume()
        else:  # a released rank rejoining its group (standby): its engine was left paused, freed
            await self._take_back()
            await self.engine.resume()

    # --- partial rollout (components/workflows/partial.py) ---------------------------
    async def partial_close(self) -> list[Unfinished]:
        """The step has enough groups (turns): this rank stops generating and hands back
        the work it has not finished (its run's close items, with the weights that made
        their tokens) for a later step; its generate() emits what it finished and
        returns, and its engine runs again, empty, for the next step. [] if its
        generation is over (or not begun)."""
        version, run = self.engine.weight_version, self.run
        if run is None or run.control.closed:
            return []
        if run.fetch_task is not None:  # every prompt of the step is in the engine (all came before END)
            await asyncio.wait([run.fetch_task])
        if run.control.closed:  # it finished its last group meanwhile (no await from here to the pause)
            return []
        items = await run.close()
        await run.control.finished.wait()
        await self.engine.resume()
        for item in items:
            item.version = version
        return items

    async def generate(self, get: str, put: str, *, version: int, chunk_size: int,
                       sampling: dict[str, Any], prefetch: int = 1) -> RolloutStats:
        """Consumes prompt groups from `get` until END: on an engine that steps on this
        loop `prefetch` in its first round trip (the workflow gives each rank its share
        of the step at once: a group a trip cost the native engine a step per trip, so
        the last groups began 30 steps late), else one; one in each later trip; puts chunks of finished groups (at most `chunk_size` each) on `put`.
        Returns its counters."""
        if self.engine.weight_version != version:
            raise StaleWeights(f"rollout holds weights v{self.engine.weight_version}, the step needs v{version}")
        run = self.run = Generation(self.engine, self.channel(put), chunk_size, sampling)

        async def take_prompts() -> None:
            await run.fetch(self.channel(get), first_trip=prefetch if self.engine.steps_on_loop else 1)
            self.admitting = False  # its END came: no more prompts for this rank
        # before any await: a partial_close may wait on it as soon as `run` is set
        fetch = run.fetch_task = asyncio.ensure_future(take_prompts())  # prefetch 1: one END
        load = await self.engine.load()
        preempted, reprefilled = load.num_preemptions, load.reprefill_tokens
        kv_fetched, kv_lost = self.kv_fetched, self.kv_lost
        try:
            await run.drive(fetch)
        except BaseException:
            run.control.finish()  # a workload_commit waiting for this run must not hang
            raise
        finally:
            fetch.cancel()
            self.admitting = False
            self.tokens_done += run.num_tokens
            self.run = None
        try:
            load = await self.engine.load()
            return RolloutStats(groups=run.num_groups, tokens=run.num_tokens, engine_steps=run.num_steps,
                                busy=run.busy.intervals, preemptions=load.num_preemptions - preempted,
                                reprefill_tokens=load.reprefill_tokens - reprefilled,
                                kv_fetched=self.kv_fetched - kv_fetched, kv_lost=self.kv_lost - kv_lost,
                                devices=load.devices, groups_exported=run.num_exported,
                                groups_imported=run.num_imported)
        finally:
            run.control.finish()
