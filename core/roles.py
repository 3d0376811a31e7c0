"""The roles core/ calls into: one Protocol per role, whose methods remote calls name
(`group.call(MigratableRank.workload_export)`). components/ implement them; core/
never imports components/."""
from __future__ import annotations

from typing import Any, Protocol

from dynarl.core.migration.records import Taken, WorkItem
from dynarl.core.migration.reshard_records import BoxLayout, ReshardLayout, StateDigest
from dynarl.core.scheduler.report import RankReport


class MigratableRank(Protocol):
    """A rank whose work moves between ranks of its group (core/migration/workload.py)."""

    async def workload_pause(self) -> None:
        """Stops its work at a step boundary."""

    async def workload_export(self) -> list[WorkItem]:
        """Its unfinished work; it stays open (it may get the items back) until commit."""

    async def workload_load(self) -> float:
        """Its load in the items' weight unit (inf: it takes no work); holds it open for an import."""

    async def workload_import(self, items: list[WorkItem]) -> Taken:
        """Takes the items over (none: ends the hold)."""

    async def workload_resume(self) -> None: ...

    async def workload_commit(self) -> None:
        """The kept ranks have its work: it lets it go."""


class ReportingRank(Protocol):
    """A rank the scheduler polls (core/scheduler/manager.py)."""

    async def metrics(self) -> RankReport: ...


class LendingRank(Protocol):
    """A rank whose devices go to the barrier stage until the step's end (mover.py)."""

    async def release_devices(self) -> None: ...

    async def reclaim_devices(self) -> None: ...


class ReshardableRank(Protocol):
    """A sharded trainer rank that P2P migration reshards (core/migration/p2p.py)."""

    async def start(self, dp_group: str | None = None, tensor_parallel_size: int | None = None,
                    init_from: str | None = None) -> int: ...

    async def reshard_layout(self) -> ReshardLayout: ...

    async def state_digest(self) -> StateDigest: ...

    async def reshard_send(self, group: str, transfers: list[list[Any]]) -> int: ...

    async def reshard_recv(self, group: str, transfers: list[list[Any]], start: int, end: int) -> int: ...

    async def reshard_send_boxes(self, group: str, old: BoxLayout, new: BoxLayout, offset: int) -> int: ...

    async def reshard_recv_boxes(self, group: str, old: BoxLayout, new: BoxLayout) -> int: ...

    async def reshard_install(self, step: int) -> StateDigest: ...

    async def reshard_retire(self) -> None: ...

    async def reshard_warm(self) -> None: ...
