"""The dynamic hypergraph: a HyperNode per component, a HyperEdge per channel.

Built from the static extraction (`hypergraph_extract`) and completed while the
job runs: spawns, moves and stops set each node's workers and devices, channel
statistics say who actually put into and got from each channel (which covers
what the extractor could not read) and how much is in flight on it, and the
scheduler's polls write each worker's load: its utilization and the requests it
holds (queue pressure), and whether the component may be interrupted now.

It is the scheduler's view (paper §4.1): the GlobalScheduler's managers
(core/scheduler), the same in `dynarl train` and `dynarl sim`, write what they
poll here and read their view from it; `dynarl graph RUN_DIR` prints the graph a
run last saved (graph.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal

from dynarl.core.hypergraph_extract import DRIVER, StaticGraph, transient

GRAPH_FILE = "graph.json"
"""Where `dynarl train` saves the graph in its run directory after each step."""


@dataclass(slots=True)
class HyperNode:
    name: str
    cls: str
    kind: Literal["dynamic", "static"] = "static"
    """dynamic: concave scaling (rollout); static: linear (trainer, inference)."""
    interruptible: bool = True
    workers: list[str] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)
    utilization: dict[str, float] = field(default_factory=dict)
    """Per worker: its last reported utilization (a rollout engine's active KV / capacity)."""
    queued: dict[str, int] = field(default_factory=dict)
    """Per worker: requests it holds, running or waiting (queue pressure), at the last poll."""

    def loads(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Utilization and queued requests of the node's current workers, in their order
        (workers a move released are no longer listed)."""
        return (tuple(self.utilization.get(w, 0.0) for w in self.workers),
                tuple(self.queued.get(w, 0) for w in self.workers))


@dataclass(slots=True)
class HyperEdge:
    channel: str
    producers: set[str] = field(default_factory=set)
    consumers: set[str] = field(default_factory=set)
    puts: int = 0
    gets: int = 0
    static: bool = True
    """False when only the runtime saw this edge (the extractor missed it)."""
    affinity: str | None = None
    """How items on it are routed to consumers: None (any), "prefer" or "strict" (by key)."""
    queued: int = 0
    """Items waiting on it now (not yet handed to a consumer), as of the last refresh."""

    @property
    def progress(self) -> int:
        """Items still in flight on this edge."""
        return self.puts - self.gets


class Hypergraph:
    def __init__(self, static: StaticGraph | None = None) -> None:
        self.nodes: dict[str, HyperNode] = {}
        self.edges: dict[str, HyperEdge] = {}
        self.warnings: list[str] = []
        if static is not None:
            for name, cls in static.nodes.items():
                self.nodes[name] = HyperNode(name, cls)
            for src, channel, dst in static.edges():
                edge = self.edges.setdefault(channel, HyperEdge(channel))
                if src != "?":
                    edge.producers.add(src)
                if dst != "?":
                    edge.consumers.add(dst)
            self.warnings = list(static.warnings)

    # --- runtime hooks -------------------------------------------------------------
    def observe_spawn(self, name: str, cls: str, workers: Iterable[str], devices: Iterable[int]) -> None:
        node = self.nodes.setdefault(name, HyperNode(name, cls))
        node.cls = cls
        node.workers = list(workers)
        node.devices = list(devices)

    def observe_stop(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        if transient(name):  # a pool's, a profile's or an old generation's ranks
            del self.nodes[name]
            return
        node.workers, node.devices, node.utilization, node.queued = [], [], {}, {}

    def observe_channel(self, channel: str, producers: dict[str, int], consumers: dict[str, float],
                        puts: int, gets: int, queued: int | None = None) -> None:
        """From a channel's statistics: producer/consumer ids are worker ids
        ("group/rank/tag") or "" for the controller's own code (the driver)."""
        edge = self.edges.get(channel)
        if edge is None:
            edge = self.edges[channel] = HyperEdge(channel, static=False)
        edge.producers |= {_node_of(p) for p in producers}
        edge.consumers |= {_node_of(c) for c in consumers}
        edge.puts, edge.gets = puts, gets
        edge.queued = puts - gets if queued is None else queued

    def observe_load(self, name: str, workers: Iterable[str], utilization: Iterable[float],
                     queued: Iterable[int]) -> None:
        """A poll of `name`'s workers: each one's utilization and requests held."""
        node = self.nodes.get(name)
        if node is None:
            return
        for worker, u, q in zip(workers, utilization, queued):
            node.utilization[worker], node.queued[worker] = float(u), int(q)
        live = set(node.workers)
        node.utilization = {w: u for w, u in node.utilization.items() if w in live}
        node.queued = {w: q for w, q in node.queued.items() if w in live}

    def observe_interruptible(self, name: str, interruptible: bool) -> None:
        if name in self.nodes:
            self.nodes[name].interruptible = interruptible

    def observe_affinity(self, channel: str, affinity: str | None) -> None:
        self.edges.setdefault(channel, HyperEdge(channel, static=False)).affinity = affinity

    # --- queries -------------------------------------------------------------------
    def successors(self, name: str) -> set[str]:
        return {c for e in self.edges.values() if name in e.producers for c in e.consumers} - {name}

    def predecessors(self, name: str) -> set[str]:
        return {p for e in self.edges.values() if name in e.consumers for p in e.producers} - {name}

    def queued(self, channel: str) -> int:
        """Items waiting on `channel` at the last refresh (0 for a channel never seen)."""
        edge = self.edges.get(channel)
        return edge.queued if edge is not None else 0

    def to_wire(self) -> dict:
        """msgpack/JSON-safe: what a run saves (graph.json) and `dynarl graph` prints."""
        return {"nodes": [{"name": n.name, "cls": n.cls, "kind": n.kind, "interruptible": n.interruptible,
                           "workers": list(n.workers), "devices": list(n.devices),
                           "utilization": dict(n.utilization), "queued": dict(n.queued)}
                          for n in sorted(self.nodes.values(), key=lambda n: n.name)],
                "edges": [{"channel": e.channel, "producers": sorted(e.producers), "consumers": sorted(e.consumers),
                           "puts": e.puts, "gets": e.gets, "static": e.static, "affinity": e.affinity,
                           "queued": e.queued}
                          for e in sorted(self.edges.values(), key=lambda e: e.channel)],
                "warnings": list(self.warnings)}

    @classmethod
    def from_wire(cls, d: dict) -> "Hypergraph":
        graph = cls()
        try:
            for n in d["nodes"]:
                graph.nodes[n["name"]] = HyperNode(
                    str(n["name"]), str(n["cls"]), n["kind"], bool(n["interruptible"]),
                    [str(w) for w in n["workers"]], [int(x) for x in n["devices"]],
                    {str(k): float(v) for k, v in n["utilization"].items()},
                    {str(k): int(v) for k, v in n["queued"].items()})
            for e in d["edges"]:
                graph.edges[e["channel"]] = HyperEdge(
                    str(e["channel"]), set(e["producers"]), set(e["consumers"]), int(e["puts"]), int(e["gets"]),
                    bool(e["static"]), e["affinity"], int(e["queued"]))
            graph.warnings = [str(w) for w in d.get("warnings", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a saved hypergraph: {exc!r}") from exc
        return graph

    def to_dot(self) -> str:
        lines = ["digraph dynarl {", "  rankdir=LR;", f'  "{DRIVER}" [shape=box, style=dashed];']
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            lines.append(f'  "{node.name}" [label="{node.name}\\n{node.cls}"];')
        for edge in sorted(self.edges.values(), key=lambda e: e.channel):
            style = "" if edge.static else ", style=dotted"
            for src in sorted(edge.producers):
                for dst in sorted(edge.consumers):
                    lines.append(f'  "{src}" -> "{dst}" [label="{edge.channel}"{style}];')
        lines.append("}")
        return "\n".join(lines)

    def describe(self) -> str:
        out = ["nodes:"]
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            line = f"  {node.name:<12} {node.cls}"
            if node.workers:  # a running (or saved) job's node: its state as the scheduler read it
                util, queued = node.loads()
                mean = sum(util) / len(util) if util else 0.0
                line += (f"  {node.kind}, {len(node.workers)} workers on devices {_ranges(node.devices)}, "
                         f"utilization {mean:.2f}, queued {sum(queued)}"
                         + ("" if node.interruptible else ", not interruptible"))
            out.append(line)
        out.append("edges:")
        for edge in sorted(self.edges.values(), key=lambda e: e.channel):
            src = ",".join(sorted(edge.producers)) or "?"
            dst = ",".join(sorted(edge.consumers)) or "?"
            extra = ("" if edge.static else "  (seen at runtime)") + (
                f"  {edge.puts} put, {edge.gets} taken, {edge.queued} waiting" if edge.puts or edge.gets else "")
            extra += f"  affinity {edge.affinity}" if edge.affinity else ""
            out.append(f"  {src} --[{edge.channel}]--> {dst}" + extra)
        for warning in self.warnings:
            out.append(f"warning: {warning}")
        return "\n".join(out)


def _ranges(devices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for d in sorted(devices):
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "-"


def _node_of(worker_id: str) -> str:
    return worker_id.split("/", 1)[0] if worker_id else DRIVER
