NUM_GPUS = 0
"""launch/sim/engine_spread.py: per-engine rollout makespans (the headroom measurement
in docs/benchmarks.md): the oracle's assignment as a table, and the makespans of a
small batch checked against the cost model's worked example."""
import json

import pytest

from dynarl.components import costmodel as cm
from dynarl.components.workloads.samples import Group, Sample
from dynarl.launch.sim import engine_spread
from dynarl.launch.sim.engine_spread import oracle_assignment, spread


def group(name: str, *lengths: int) -> Group:
    return Group(name, 10, tuple(Sample(f"{name}/{k}", n) for k, n in enumerate(lengths)))


GROUPS = [group("a", 500), group("b", 5000), group("c", 2000), group("d", 4000), group("e", 1000), group("f", 3000)]


@pytest.mark.parametrize("engines, per_express, express, expected", [
    # longest first: b d f c e a; the first per_express*express on the express engines, the rest dealt over the others
    # (by index: a b c d e f)
    (3, 1, 1, [1, 0, 1, 1, 2, 2]),   # b alone on engine 0; d f c e a dealt over 1, 2
    (3, 2, 1, [2, 0, 2, 0, 1, 1]),   # b, d on engine 0; f c e a over 1, 2
    (4, 1, 2, [3, 0, 3, 1, 2, 2]),   # b on 0, d on 1; f c e a over 2, 3
])
def test_the_oracle_spreads_the_longest_groups_over_the_express_engines(engines, per_express, express, expected):
    assert oracle_assignment(GROUPS, engines, per_express, express) == expected


def test_makespans_follow_the_cost_model():
    """One request alone on an engine costs prefill(prompt) + its decode steps at batch 1."""
    model, device = cm.get_model("qwen2.5-7b"), cm.get_device("h100-80gb")
    alone = engine_spread.engine_makespans([group("x", 100)], [0], 1, "qwen2.5-7b", 2)[0]
    expected = cm.prefill_time(model, device, 10, 2) + cm.decode_steps_time(model, device, 1, 10, 100, 2)
    assert alone == pytest.approx(expected, rel=1e-6)
    out = spread(GROUPS, 3, "qwen2.5-7b", 2)
    dealt = out["dealt"]
    assert dealt["first_engine_done_s"] <= dealt["mean_engine_s"] <= dealt["makespan_s"]
    assert 0 < dealt["busy_frac"] <= 1
    # no assignment beats the longest group decoding alone
    b_alone = engine_spread.engine_makespans([GROUPS[1]], [0], 1, "qwen2.5-7b", 2)[0]
    assert dealt["makespan_s"] >= round(b_alone, 1) and out["oracle_makespan_s"] >= round(b_alone, 1)
    assert out["oracle_split"]["express_engines"] in (1, 2)


def test_the_command_refuses_a_multi_turn_workload(capsys):
    assert engine_spread.main(["--workload", "agentic-rstar"]) == 2
    assert "single-turn" in capsys.readouterr().err


def test_the_command_prints_json(monkeypatch, capsys):
    monkeypatch.setattr(engine_spread, "generate", lambda workload, seed, it, prompts: GROUPS)
    assert engine_spread.main(["--workload", "math-7b", "--devices", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engines"] == 3 and out["dealt"]["makespan_s"] > 0
