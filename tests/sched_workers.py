"""Engines whose work is known sleeps on the loop clock, for scheduler tests in virtual time."""
import asyncio

import dynarl


class TimedEngine(dynarl.Worker):
    """Holds requests that each finish at a given loop time; reports the utilization
    signal (running / capacity) and supports the Workload migration protocol."""

    def __init__(self, capacity: int = 4, backlog: float = 0.0) -> None:
        self.capacity = capacity
        self.backlog = backlog
        """Queued work units beyond the running requests (an inference queue)."""
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

    def metrics(self) -> dict:
        self._collect()
        return {"utilization": len(self.requests) / self.capacity, "running": len(self.requests),
                "waiting": 0, "work_done": self.work_done,
                "remaining_work": self.backlog + float(len(self.requests))}

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

    def workload_export(self) -> list[dict]:
        items = [{"id": rid, "weight": 1.0, "until": until} for rid, until in self.requests.items()]
        self.requests = {}
        return items

    def workload_load(self) -> float:
        return float(len(self.requests))

    def workload_import(self, items: list[dict]) -> int:
        self.requests.update({item["id"]: item["until"] for item in items})
        return len(items)

    def finished(self) -> list[str]:
        self._collect()
        return self.done
