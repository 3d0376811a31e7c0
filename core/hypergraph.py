"""The dynamic hypergraph: a HyperNode per component, a HyperEdge per channel.

Built from the static extraction (`hypergraph_extract`) and completed while the
job runs: spawns and stops add and remove workers and devices, channel
statistics say who actually put into and got from each channel (which covers
what the extractor could not read), and managers report utilization.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal

from dynarl.core.hypergraph_extract import DRIVER, StaticGraph


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


@dataclass(slots=True)
class HyperEdge:
    channel: str
    producers: set[str] = field(default_factory=set)
    consumers: set[str] = field(default_factory=set)
    puts: int = 0
    gets: int = 0
    static: bool = True
    """False when only the runtime saw this edge (the extractor missed it)."""

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
        if node is not None:
            node.workers, node.devices, node.utilization = [], [], {}

    def observe_channel(self, channel: str, producers: dict[str, int], consumers: dict[str, float],
                        puts: int, gets: int) -> None:
        """From a channel's statistics: producer/consumer ids are worker ids
        ("group/rank/tag") or "" for the controller's own code (the driver)."""
        edge = self.edges.get(channel)
        if edge is None:
            edge = self.edges[channel] = HyperEdge(channel, static=False)
        edge.producers |= {_node_of(p) for p in producers}
        edge.consumers |= {_node_of(c) for c in consumers}
        edge.puts, edge.gets = puts, gets

    def observe_utilization(self, name: str, worker: str, value: float) -> None:
        if name in self.nodes:
            self.nodes[name].utilization[worker] = value

    # --- queries -------------------------------------------------------------------
    def successors(self, name: str) -> set[str]:
        return {c for e in self.edges.values() if name in e.producers for c in e.consumers} - {name}

    def predecessors(self, name: str) -> set[str]:
        return {p for e in self.edges.values() if name in e.consumers for p in e.producers} - {name}

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
            out.append(f"  {node.name:<12} {node.cls}")
        out.append("edges:")
        for edge in sorted(self.edges.values(), key=lambda e: e.channel):
            src = ",".join(sorted(edge.producers)) or "?"
            dst = ",".join(sorted(edge.consumers)) or "?"
            out.append(f"  {src} --[{edge.channel}]--> {dst}" + ("" if edge.static else "  (seen at runtime)"))
        for warning in self.warnings:
            out.append(f"warning: {warning}")
        return "\n".join(out)


def _node_of(worker_id: str) -> str:
    return worker_id.split("/", 1)[0] if worker_id else DRIVER
