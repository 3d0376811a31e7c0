"""Custody: who holds each item taken from a channel, until the work made of it is put
downstream (transport/channel.py keeps one where `Channel.custody` is set; the
in-place survival of a lost rank reclaims what it held: components/workflows/
survival.py)."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Hashable

if TYPE_CHECKING:
    from dynarl.transport.channel import Entry


class Custody:
    """Who holds each item taken from a channel, until the work made of it is put
    downstream (exactly once: a consumer that dies holding items gives them back).

    An item's names: those its producer put it with (Entry.names: the items upstream it
    was made of, e.g. a chunk's prompt groups), else `ident(item)` (one name, or None:
    an item that is not work, such as END, held until the consumer's call ends:
    `forget`). A put on a channel whose `releases` is this channel carries the names
    its item was made of, and the same message releases them here: an item is released
    when what was made of it is downstream, so a consumer lost before that put still
    holds it, and one lost after does not. (A consumer puts what it made of one item in
    one message: ChannelClient.put_all for several pieces.)"""

    def __init__(self, ident: Callable[[Any], Hashable | None]) -> None:
        self.ident = ident
        self.held: dict[str, dict[Hashable, Entry]] = defaultdict(dict)
        """consumer -> name -> the entry it took (in the order taken)."""
        self.other: dict[str, list[Entry]] = defaultdict(list)
        """consumer -> entries without a name it took (END markers)."""
        self.holder: dict[Hashable, str] = {}

    def names(self, entry: Entry) -> tuple:
        if entry.names:
            return tuple(entry.names)
        name = self.ident(entry.item)
        return () if name is None else (name,)

    def took(self, consumer: str, entry: Entry) -> None:
        names = self.names(entry)
        if not names:
            self.other[consumer].append(entry)
            return
        for name in names:  # (a name held by another consumer moves: the newest take holds it)
            previous = self.holder.get(name)
            if previous is not None and previous != consumer:
                self.held[previous].pop(name, None)
            self.held[consumer][name] = entry
            self.holder[name] = consumer

    def returned(self, consumer: str, entry: Entry) -> None:
        """Given back untaken (a cancelled get, a stopping consumer's prefetch)."""
        names = self.names(entry)
        if not names:
            others = self.other.get(consumer, [])
            if entry in others:
                others.remove(entry)
        for name in names:
            if self.holder.get(name) == consumer:
                del self.holder[name]
                del self.held[consumer][name]

    def release(self, names: list) -> None:
        """The items' work is downstream (whoever holds them: a migration may have moved
        the work to another consumer)."""
        for name in map(name_key, names):
            consumer = self.holder.pop(name, None)
            if consumer is not None:
                del self.held[consumer][name]

    def reclaim(self, consumer: str) -> list[Entry]:
        """A lost consumer's items, each once, in the order it took them (its END last):
        removed (an item of several names goes back whole)."""
        entries: list[Entry] = []
        for entry in self.held.pop(consumer, {}).values():
            if not any(e is entry for e in entries):
                entries.append(entry)
        for entry in entries:
            for name in self.names(entry):
                if self.holder.get(name) == consumer:
                    del self.holder[name]
        return entries + self.other.pop(consumer, [])

    def forget(self, consumer: str) -> list[Hashable]:
        """The consumer's call ended: what it still held is dropped (its END); returns
        the names it held unreleased (none, when every item's work went downstream)."""
        self.other.pop(consumer, None)
        names = list(self.held.pop(consumer, {}))
        for name in names:
            del self.holder[name]
        return names


def name_key(name: Any) -> Hashable:
    """A name as the wire brings it (a list) made hashable (a tuple)."""
    return tuple(name) if isinstance(name, list) else name
