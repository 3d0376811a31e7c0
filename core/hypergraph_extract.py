"""The static half of the hypergraph, read from a workflow's source with `ast`.

What it understands:
- classes deriving from `Worker` (directly or through classes in the same
  files) become HyperNodes; `ctl.spawn(Cls, name="rollout", ...)` names them;
- `<anything>.channel("name").put(...)` / `.get(...)` / `.get_batch(...)` inside
  a Worker class makes that class a producer / consumer of channel "name", also
  through a local name or a `self.attr` bound to `.channel("name")`;
  the same calls elsewhere (the workflow's driver code) belong to the `driver`;
- a call that passes a spawned group (`g.rollout`, `rollout`) together with
  literal `get="a"` / `put="b"` keywords (a stage helper) makes that group a
  consumer of "a" and a producer of "b".
What it can't read (a channel name that is not a literal, a stage call whose
group it can't tell) becomes a warning naming the file and line; the runtime
half (`Hypergraph.observe_*`) completes the graph while the job runs.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

DRIVER = "driver"
CHANNEL_OPS = {"put": "put", "put_nowait": "put", "get": "get", "get_nowait": "get", "get_batch": "get",
               "get_entry": "get", "take_nowait": "get"}


@dataclass(slots=True)
class StaticGraph:
    nodes: dict[str, str] = field(default_factory=dict)
    """node name -> Worker class name."""
    producers: dict[str, set[str]] = field(default_factory=dict)
    """channel -> node names that put into it."""
    consumers: dict[str, set[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, channel: str, node: str, op: str) -> None:
        side = self.producers if op == "put" else self.consumers
        side.setdefault(channel, set()).add(node)

    def edges(self) -> list[tuple[str, str, str]]:
        """(producer, channel, consumer), sorted."""
        out = []
        for channel in sorted(set(self.producers) | set(self.consumers)):
            for src in sorted(self.producers.get(channel, {"?"})):
                for dst in sorted(self.consumers.get(channel, {"?"})):
                    out.append((src, channel, dst))
        return out


def extract(sources: dict[str, str]) -> StaticGraph:
    """`sources`: file name -> Python source. Worker classes may live in any of them."""
    trees = {name: ast.parse(text, filename=name) for name, text in sources.items()}
    workers, bases = _worker_classes(trees.values())
    graph = StaticGraph()
    names = _spawned_names(trees, workers, graph)
    for cls in sorted(workers):
        if cls in names or cls not in bases:  # a base class never spawned is not a component
            graph.nodes.setdefault(names.get(cls, cls), cls)
    by_class = {cls: names.get(cls, cls) for cls in workers}
    for filename, tree in trees.items():
        _Visitor(filename, graph, by_class, set(graph.nodes)).visit(tree)
    return graph


def _worker_classes(trees) -> tuple[set[str], set[str]]:
    """Worker subclasses, and those of them that other Worker subclasses derive from."""
    bases: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {_name(b) for b in node.bases}
    found = {"Worker"}
    changed = True
    while changed:  # subclasses of subclasses, within the files read
        changed = False
        for cls, parents in bases.items():
            if cls not in found and parents & found:
                found.add(cls)
                changed = True
    found.discard("Worker")
    parents_of_workers = {p for cls in found for p in bases.get(cls, ())} & found
    return found, parents_of_workers


def _class_attributes(trees) -> dict[str, str]:
    """Class-level `attr = Cls` / `attr: type = Cls`: a workflow may spawn `self.attr`
    so that a subclass can swap the worker class (the base class's value is read)."""
    found: dict[str, str] = {}
    for tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    target, value = stmt.target.id, stmt.value
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    target, value = stmt.targets[0].id, stmt.value
                else:
                    continue
                if isinstance(value, ast.Name):
                    found.setdefault(target, value.id)
    return found


def transient(group: str) -> bool:
    """A group that stands in for a component a while, named by the runtime's
    conventions: `name~standby` (a warm pool), `name~profile` (a profile's ranks),
    `name@3` (a move's new generation). Not a node of the static graph; it leaves
    the runtime graph when it stops."""
    return "~" in group or "@" in group


def _spawned_names(trees: dict[str, ast.Module], workers: set[str], graph: StaticGraph) -> dict[str, str]:
    names: dict[str, str] = {}
    attributes = _class_attributes(trees.values())
    for filename, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "spawn" and node.args:
                cls = _name(node.args[0])
                if cls not in workers and isinstance(node.args[0], ast.Attribute):
                    cls = attributes.get(cls, cls)
                if cls not in workers:
                    continue
                name_kw = next((k.value for k in node.keywords if k.arg == "name"), None)
                if isinstance(name_kw, ast.Constant) and isinstance(name_kw.value, str):
                    if not transient(name_kw.value):
                        names[cls] = name_kw.value
                elif name_kw is not None:
                    graph.warnings.append(f"{filename}:{node.lineno}: spawn of {cls} with a non-literal name")
    return names


class _Visitor(ast.NodeVisitor):
    def __init__(self, filename: str, graph: StaticGraph, by_class: dict[str, str], nodes: set[str]) -> None:
        self.filename = filename
        self.graph = graph
        self.by_class = by_class
        self.nodes = nodes
        self.owner = DRIVER
        self.aliases: dict[str, str] = {}
        """`name` or `self.attr` -> channel, for handles kept in a variable."""

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        previous, saved = self.owner, self.aliases
        self.owner = self.by_class.get(node.name, previous)
        self.aliases = {}
        for sub in ast.walk(node):  # `self.out = self.channel("x")` anywhere in the class
            self._record_alias(sub, attributes_only=True)
        self.generic_visit(node)
        self.owner, self.aliases = previous, saved

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        saved = dict(self.aliases)
        for sub in ast.walk(node):
            self._record_alias(sub, attributes_only=False)
        self.generic_visit(node)
        self.aliases = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def _record_alias(self, node: ast.AST, attributes_only: bool) -> None:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)
                and _name(node.value.func) == "channel" and node.value.args):
            return
        arg, target = node.value.args[0], node.targets[0]
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            return  # reported where it is used
        key = _alias_key(target)
        if key is not None and (not attributes_only or key.startswith("self.")):
            self.aliases[key] = arg.value

    def visit_Call(self, node: ast.Call) -> None:
        self._channel_op(node)
        self._stage_call(node)
        self.generic_visit(node)

    def _channel_op(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in CHANNEL_OPS):
            return
        target = func.value
        alias = _alias_key(target)
        if alias is not None and alias in self.aliases:
            self.graph.add(self.aliases[alias], self.owner, CHANNEL_OPS[func.attr])
            return
        if not (isinstance(target, ast.Call) and _name(target.func) == "channel"):
            return
        arg = target.args[0] if target.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            self.graph.add(arg.value, self.owner, CHANNEL_OPS[func.attr])
        else:
            self.graph.warnings.append(f"{self.filename}:{node.lineno}: channel name is not a literal "
                                       f"({ast.unparse(arg) if arg is not None else 'missing'}); "
                                       "its edge is left to the runtime")

    def _stage_call(self, node: ast.Call) -> None:
        literal = {k.arg: k.value.value for k in node.keywords
                   if k.arg in ("get", "put") and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
        if not literal:
            return
        groups = [n for n in (_name(a) for a in node.args) if n in self.nodes]
        if len(groups) != 1:
            self.graph.warnings.append(f"{self.filename}:{node.lineno}: a call with get=/put= channels whose "
                                       "worker group can't be told from its arguments")
            return
        for op, channel in literal.items():
            self.graph.add(channel, groups[0], op)


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _alias_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None
