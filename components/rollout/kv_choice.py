"""Move a request's KV with it, or have the receiver prefill it again: the choice per request.

A Workload migration (rollout.move_kv) can bring a moved request's KV along or let
the engine that takes it compute its context again. Which is cheaper depends on the
request's size and on two costs the receiver knows:

- its prefill, seconds per new token (EngineLoad.prefill_s_per_token: measured by the
  native engine, the cost model's on emulated ones);
- taking KV in: a fixed cost per transfer plus seconds per token (`KVLinkFit`, fit by
  least squares to the transfers this rank made: fetch plus import, plus what the engine
  charged itself for it), or before any transfer the engine's own figure
  (EngineLoad.kv_move_s_per_token: the cost model's link, no fixed cost).

`choose` is the decision. A cost that is not known yet moves the KV: the user asked for
move_kv, and the move measures the link.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVCost:
    """What taking in `tokens` of KV costs: latency_s + tokens * per_token_s."""
    latency_s: float
    per_token_s: float

    def seconds(self, tokens: int) -> float:
        return self.latency_s + tokens * self.per_token_s


def choose(tokens: int, move: KVCost | None, prefill_s_per_token: float) -> bool:
    """True: move the KV of `tokens` tokens; False: the receiver prefills them again.
    Unknown costs (None, or a prefill rate of 0) move it; equal costs move it."""
    if tokens <= 0:
        return False
    if move is None or prefill_s_per_token <= 0:
        return True
    return move.seconds(tokens) <= tokens * prefill_s_per_token


@dataclass(slots=True)
class KVLinkFit:
    """seconds = latency + tokens * per_token, least squares over the transfers seen
    (sums kept, so adding one is O(1)). Both terms are kept >= 0; with one distinct
    size the whole cost is per token."""
    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        x, y = float(tokens), max(float(seconds), 0.0)
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y

    def cost(self) -> KVCost | None:
        if self.n == 0 or self.sx <= 0:
            return None
        spread = self.n * self.sxx - self.sx * self.sx
        if spread <= 1e-9 * self.sxx * self.n:  # one size: no fixed cost can be told apart
            return KVCost(0.0, self.sy / self.sx)
        per_token = (self.n * self.sxy - self.sx * self.sy) / spread
        latency = (self.sy - per_token * self.sx) / self.n
        if per_token < 0:  # bigger transfers never cost less: all of it is fixed cost
            return KVCost(self.sy / self.n, 0.0)
        if latency < 0:  # the line through the origin that fits best
            return KVCost(0.0, self.sxy / self.sxx)
        return KVCost(latency, per_token)
