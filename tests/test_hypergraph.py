NUM_GPUS = 0

import json
import os
import subprocess
import sys

import pytest

import dynarl
from dynarl import RuntimeConfig
from dynarl.core.hypergraph import Hypergraph
from dynarl.core.hypergraph_extract import extract
from workers import Consumer, Producer

WORKFLOW = '''
import dynarl

class Base(dynarl.Worker):
    pass

class Generator(Base):
    async def run(self):
        out = self.channel("samples")
        await out.put(1)

class Scorer(dynarl.Worker):
    def __init__(self):
        self.results = self.channel("scores")

    async def run(self):
        item = await self.channel("samples").get()
        await self.results.put(item)

class Learner(dynarl.Worker):
    async def learn(self, batch):
        return batch

async def workflow(ctl, name):
    gen = await ctl.spawn(Generator, name="gen", num_ranks=2)
    scorer = await ctl.spawn(Scorer, name="scorer", num_ranks=1)
    learner = await ctl.spawn(Learner, name="learner", num_ranks=1)
    await ctl.channel("prompts").put("p")
    await stage(learner, get="scores", put="updates")
    await stage(other, get="x")
    await ctl.channel(name).put(3)
'''


def test_extract_nodes_edges_and_warnings():
    graph = extract({"wf.py": WORKFLOW})
    assert graph.nodes == {"gen": "Generator", "scorer": "Scorer", "learner": "Learner"}
    assert graph.edges() == [
        ("driver", "prompts", "?"),
        ("gen", "samples", "scorer"),
        ("scorer", "scores", "learner"),
        ("learner", "updates", "?"),
    ]
    lines = WORKFLOW.splitlines()
    stage_line = lines.index('    await stage(other, get="x")') + 1
    dynamic_line = lines.index("    await ctl.channel(name).put(3)") + 1
    assert len(graph.warnings) == 2
    assert any(f"wf.py:{stage_line}:" in w and "group can't be told" in w for w in graph.warnings)
    assert any(f"wf.py:{dynamic_line}:" in w and "not a literal (name)" in w for w in graph.warnings)


def test_hypergraph_queries_and_dot():
    graph = Hypergraph(extract({"wf.py": WORKFLOW}))
    assert graph.successors("gen") == {"scorer"} and graph.predecessors("learner") == {"scorer"}
    dot = graph.to_dot()
    assert '"gen" -> "scorer" [label="samples"]' in dot and dot.startswith("digraph")


async def test_runtime_half_completes_what_the_source_hides():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Producer, name="producer", num_ranks=1)
        consumer = await ctl.spawn(Consumer, name="consumer", num_ranks=1)
        await producer.call(Producer.produce, "hidden", [1, 2, 3])  # channel name passed as data
        await consumer.call(Consumer.consume, "hidden", 3)
        await ctl.channel("hidden").put("from-driver")
        graph = ctl.refresh_graph()
        edge = graph.edges["hidden"]
        assert edge.producers == {"producer", "driver"} and edge.consumers == {"consumer"}
        assert not edge.static and edge.progress == 1
        assert graph.nodes["producer"].cls == "Producer" and graph.nodes["producer"].devices == [0]
    assert graph.nodes["producer"].workers == []  # stopped at shutdown


def test_cli_lists_and_draws_a_workflow_file(tmp_path):
    path = tmp_path / "wf.py"
    path.write_text(WORKFLOW)
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "gen --[samples]--> scorer" in out.stdout and "warning:" in out.stdout
    dot = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", str(path), "--dot"],
                         capture_output=True, text=True, timeout=300)
    assert dot.stdout.startswith("digraph")
    missing = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_cli_reads_the_builtin_grpo_workflow():
    import dynarl.components.workflows.grpo as grpo
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "graph", grpo.__file__],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    edges = {}  # "src --[channel]--> dst,dst" lines; the workflow modules it uses (overlap.py) included
    for line in out.stdout.splitlines():
        if "--[" in line:
            srcs, rest = line.strip().split(" --[")
            channel, dsts = rest.split("]--> ")
            for src in srcs.split(","):  # (reward and, with judge.enabled, the judge put on "scored")
                edges[(src, channel)] = set(dsts.split(","))
    for src, channel, dst in (("driver", "prompts", "rollout"), ("rollout", "rollouts", "reward"),
                              ("reward", "scored", "inference"), ("inference", "experience", "driver"),
                              ("reward", "rewarded", "judge"), ("judge", "scored", "inference")):
        assert dst in edges[(src, channel)], out.stdout
    assert "warning" not in out.stdout


def test_a_worker_class_held_in_a_class_attribute_is_resolved():
    source = '''
import dynarl

class Actor(dynarl.Worker):
    async def run(self):
        await self.channel("out").put(1)

class Flow:
    actor_class: type = Actor

    async def start(self, ctl):
        self.actors = await ctl.spawn(self.actor_class, name="actors")
'''
    graph = extract({"flow.py": source})
    assert graph.nodes == {"actors": "Actor"}
    assert graph.edges() == [("actors", "out", "?")]  # a producer with no consumer in this source


def test_the_scheduler_view_round_trips_and_forgets_released_workers():
    """What the scheduler writes (loads, interruptibility, affinity) reads back the
    same, in the node's worker order; a worker a move released drops out of the view."""
    graph = Hypergraph(extract({"wf.py": WORKFLOW}))
    graph.observe_spawn("gen", "Generator", ["gen/0/a", "gen/1/b", "gen/2/c"], [0, 2, 4])
    graph.observe_load("gen", ["gen/0/a", "gen/1/b", "gen/2/c"], [0.5, 0.1, 0.0], [7, 1, 0])
    graph.observe_spawn("gen", "Generator", ["gen/0/a", "gen/2/c"], [0, 4])  # gen/1 released
    graph.observe_load("gen", ["gen/2/c", "gen/0/a"], [0.3, 0.6], [2, 9])
    graph.observe_interruptible("gen", False)
    graph.observe_affinity("samples", "prefer")
    graph.observe_channel("samples", {"gen/0/a": 3}, {"scorer/0/x": 2.0}, puts=3, gets=2, queued=1)
    node = graph.nodes["gen"]
    assert node.loads() == ((0.6, 0.3), (9, 2)) and set(node.utilization) == {"gen/0/a", "gen/2/c"}
    back = Hypergraph.from_wire(json.loads(json.dumps(graph.to_wire())))
    assert back.to_wire() == graph.to_wire()
    assert back.nodes["gen"].loads() == node.loads() and back.queued("samples") == 1 and back.queued("none") == 0
    text = back.describe()
    assert "2 workers on devices 0,4, utilization 0.45, queued 11, not interruptible" in text
    assert "3 put, 2 taken, 1 waiting  affinity prefer" in text
    with pytest.raises(ValueError, match="not a saved hypergraph"):
        Hypergraph.from_wire({"nodes": [{"name": "x"}], "edges": []})
