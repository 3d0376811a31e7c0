"""Replay protection: each message a receiving socket takes, it takes once."""
from __future__ import annotations

REPLAY_WINDOW = 1 << 16
"""How far behind the newest message of a sender another may arrive (its encodes and
sends can interleave across coroutines) and still be taken once."""
MAX_SENDERS = 1 << 16


class ReplayWindow:
    """The nonces one receiving socket has taken, per sender (a Codec: the nonce's
    random prefix; its counter rises with each message it encodes): each is taken
    once, and one more than REPLAY_WINDOW behind the sender's newest is refused, so a
    captured message resent to the same socket is dropped. Only authenticated nonces
    come here (a forged one cannot move the window)."""

    def __init__(self, width: int = REPLAY_WINDOW, max_senders: int = MAX_SENDERS) -> None:
        self.width, self.max_senders = width, max_senders
        self._mask = (1 << width) - 1
        self._senders: dict[bytes, list[int]] = {}
        """prefix -> [newest counter, bitmap of the counters taken: bit i = newest - i]"""

    def admit(self, nonce: bytes) -> bool:
        prefix, counter = nonce[:8], int.from_bytes(nonce[8:], "little")
        state = self._senders.get(prefix)
        if state is None:
            if len(self._senders) >= self.max_senders:  # the longest-known sender goes
                del self._senders[next(iter(self._senders))]
            self._senders[prefix] = [counter, 1]
            return True
        newest, taken = state
        if counter > newest:
            shift = counter - newest
            state[0], state[1] = counter, ((taken << shift) | 1) & self._mask if shift < self.width else 1
            return True
        offset = newest - counter
        if offset >= self.width or (taken >> offset) & 1:
            return False
        state[1] = taken | (1 << offset)
        return True
