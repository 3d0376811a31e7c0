"""Engines whose work is known sleeps on the loop clock, for scheduler tests in virtual time."""
import asyncio

import dynarl
from dynarl.core.migration.records import Taken, WorkItem
from dynarl.core.scheduler.report import RankReport


class TimedEngine(dynarl.Worker):
    """Holds requests that each finish at a given loop time; reports the utilization
    signal (running / capacity) and supports the Workload migration protocol."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self.requests: dict[str, float] = {}
        self.done: list[str] = []
        self.paused = False
        self.work_done = 0.0

    def submit(self, items: dict) -> int:
        self.requests.update(items)
        return len(self.requests)

    def _collect(self) -> None:
        now = asyncio.get_running_loop().time()
        if self.paused:
            return
        for rid, until in list(self.requests.items()):
            if until <= now:
                del self.requests[rid]
                self.done.append(rid)
                self.work_done += 1

    def metrics(self) -> RankReport:
        """A rollout engine's report: one KV token per request, one output token made
        per running request, each finished one made 10; a stage's: nothing processed
        (its backlog is all left)."""
        self._collect()
        running, finished = len(self.requests), len(self.done) - getattr(self, "reported_done", 0)
        return RankReport(utilization=running / self.capacity, running=running, kv=running, capacity=self.capacity,
                          generated=running, finished=finished, finished_tokens=10 * finished,
                          active_run=running > 0, work_done=self.work_done)

    def end_run(self) -> None:
        """Its stage call returned: like a real rank with no generation, it reports nothing
        finished (a run's counters go with the run)."""
        self._collect()
        self.reported_done = len(self.done)

    async def wait_all(self) -> list[str]:
        while True:
            self._collect()
            if not self.requests:
                return self.done
            await asyncio.sleep(0.5)

    def workload_pause(self) -> None:
        self._collect()
        self.paused = True

    def workload_commit(self) -> None:
        pass

    def workload_resume(self) -> None:
        self.paused = False

    def workload_export(self) -> list[WorkItem]:
        items = [WorkItem(rid, 1.0, until) for rid, until in self.requests.items()]
        self.requests = {}
        return items

    def workload_load(self) -> float:
        return float(len(self.requests))

    def workload_import(self, items: list[WorkItem]) -> Taken:
        self.requests.update({item.id: item.body for item in items})
        return Taken(len(items))

    def finished(self) -> list[str]:
        self._collect()
        return self.done

    def release_devices(self) -> None:
        """Lent to the barrier stage (core/migration/mover.py): its memory would be freed."""
        self.lent = getattr(self, "lent", 0) + 1

    def reclaim_devices(self) -> None:
        self.lent -= 1

    def lent_now(self) -> int:
        return getattr(self, "lent", 0)


class ClosingEngine(TimedEngine):
    """A TimedEngine whose generation closes when its last request finishes: then it
    takes no work (workload_load inf), as a RolloutWorker whose generate() returned."""

    def workload_load(self) -> float:
        self._collect()
        return float(len(self.requests)) if self.requests else float("inf")
