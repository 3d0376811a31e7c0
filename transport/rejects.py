"""What a receiver does with the messages it drops (wire.py's WireError reasons):
counts them by reason and keeps serving; the log gets the first, then summaries."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


REJECT_LOG_EVERY_S = 10.0
"""After the first rejection is logged, at most one summary line per this many seconds."""


@dataclass(slots=True)
class RejectCounter:
    """How many messages a receiver dropped, by reason; receivers keep serving. The log
    gets the first rejection, then at most one line per REJECT_LOG_EVERY_S with the
    counts since the last (and what is left at `flush`): a flood is counted, not
    printed line by line, which cost more than the check itself (450k lines)."""
    where: str = "a receiver"
    counts: Counter = field(default_factory=Counter)
    _since: Counter = field(default_factory=Counter)
    _peers: set = field(default_factory=set)
    _logged_at: float | None = None

    def add(self, reason: str, peer: Any = None, detail: Any = None) -> None:
        """`detail` (the WireError, say) is formatted only if this one is logged."""
        self.counts[reason] += 1
        now = time.monotonic()
        if self._logged_at is None:
            self._logged_at = now
            log.warning("%s rejected a message from %r: %s", self.where, peer, detail or reason)
            return
        self._since[reason] += 1
        if len(self._peers) < 1000:
            self._peers.add(peer)
        if now - self._logged_at >= REJECT_LOG_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Logs the rejections not logged yet (one line), if any."""
        if self._since and self._logged_at is not None:
            now = time.monotonic() if now is None else now
            reasons = ", ".join(f"{r} {n}" for r, n in self._since.most_common())
            log.warning("%s rejected %d more messages from %s peers in %.0f s (%s)", self.where,
                        sum(self._since.values()), len(self._peers) if len(self._peers) < 1000 else "1000+",
                        now - self._logged_at, reasons)
            self._since.clear()
            self._peers.clear()
            self._logged_at = now

    @property
    def total(self) -> int:
        return sum(self.counts.values())
