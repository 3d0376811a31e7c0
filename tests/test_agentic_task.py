NUM_GPUS = 0
"""The built-in agentic task: generation, verification, config selection."""

import pytest

from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.tasks.calc import CalcConfig, CalcTask, calc_score, demonstration, is_direct
from dynarl.components.tasks.source import ProblemSource, TaskConfig
from dynarl.components.workflows.config import load_config
from dynarl.transport.errors import ConfigError

AGENTIC = {"workflow": "agentic", "task": {"kind": "calc"}}


def test_problems_are_a_pure_function_of_seed_and_index():
    a, b = CalcTask(CalcConfig(), seed=3), CalcTask(CalcConfig(), seed=3)
    assert [a.problem(i) for i in range(20)] == [b.problem(i) for i in range(20)]
    assert a.problem(0) != CalcTask(CalcConfig(), seed=4).problem(0)
    assert a.problem(5, "warm") != a.problem(5, "calc")


@pytest.mark.parametrize("digits, ops", [([3, 2], "*+"), ([2, 2], "-"), ([4, 3], "*"), ([1, 1], "+-*")])
def test_answers_are_the_arithmetic_of_the_prompt(digits, ops):
    task = CalcTask(CalcConfig(digits=digits, ops=ops), seed=0)
    for i in range(50):
        p = task.problem(i)
        assert p.prompt.endswith("=")
        left, op, right = next((p.prompt[:k], p.prompt[k], p.prompt[k + 1:-1]) for k in range(1, len(p.prompt))
                               if p.prompt[k] in "+-*")
        assert op in ops and len(left) == digits[0] and len(right) == digits[1]
        assert int(p.answer) == {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(left), int(right))


@pytest.mark.parametrize("response, answer, score", [
    ("10063", "10063", 1.0),
    (" 10063\n", "10063", 1.0),          # surrounding whitespace is not an error
    ("10064", "10063", 0.4),             # 4 of 5 positions
    ("1006", "10063", 0.4),              # one digit short
    ("", "10063", 0.0),
    ("99999", "10063", 0.0),
    ("100630", "10063", 0.5 * 5 / 6),    # one digit too many
])
def test_calc_score(response, answer, score):
    assert calc_score(response, answer) == pytest.approx(score)


def test_demonstration_calls_the_tool_then_answers():
    p = CalcTask(CalcConfig(), seed=0).problem(0)
    segments = demonstration(p)
    assert segments == [(f"[calc {p.prompt[:-1]}]", True), (f"={p.answer}\n", False), (p.answer, True)]
    CharTokenizer().encode(p.prompt + "".join(t for t, _ in segments))  # the char tokenizer spells all of it


def test_demonstration_with_the_python_tool():
    p = CalcTask(CalcConfig(tool="py"), seed=0).problem(0)
    segments = demonstration(p, tool="py")
    assert segments[0] == (f"[py print({p.prompt[:-1]})]", True) and segments[1:] == [(f"={p.answer}\n", False),
                                                                                      (p.answer, True)]
    CharTokenizer().encode(p.prompt + "".join(t for t, _ in segments))
    with pytest.raises(ValueError, match="tool must be one of"):
        CalcConfig(tool="shell")


@pytest.mark.parametrize("frac", [0.0, 0.3, 1.0])
def test_direct_demonstrations_answer_without_the_tool(frac):
    task = CalcTask(CalcConfig(), seed=0)
    problems = [task.problem(i, "warm") for i in range(400)]
    direct = [is_direct(p, 0, frac) for p in problems]
    assert direct == [is_direct(p, 0, frac) for p in problems]  # a pure function of (seed, problem)
    assert sum(direct) / len(direct) == pytest.approx(frac, abs=0.06)
    assert demonstration(problems[0], direct=True) == [(problems[0].answer, True)]


def test_source_serves_calc_and_keeps_warmup_apart():
    source = ProblemSource(TaskConfig(kind="calc"), seed=0)
    train, warm = source.problems(0, 8), source.warmup_problems(0, 8)
    assert [p.id for p in train] == [f"calc-{i}" for i in range(8)]
    assert {p.id for p in train}.isdisjoint({p.id for p in warm})
    assert TaskConfig(kind="calc").resolved_verifier == "exact"


@pytest.mark.parametrize("data, field", [
    ({"workflow": "agentic"}, "task.kind"),                                    # agentic needs calc
    ({"task": {"kind": "calc"}}, "workflow"),                                  # calc needs agentic
    ({**AGENTIC, "workflow": "react"}, "workflow"),
    ({**AGENTIC, "agentic": {"max_turns": 0}}, "agentic.max_turns"),
    ({**AGENTIC, "agentic": {"queue": "lifo"}}, "agentic.queue"),
    ({**AGENTIC, "agentic": {"affinity": "must"}}, "agentic.affinity"),
    ({**AGENTIC, "task": {"kind": "calc", "calc": {"digits": [3]}}}, "task.calc.digits"),
    ({**AGENTIC, "task": {"kind": "calc", "calc": {"ops": "/"}}}, "task.calc.ops"),
    ({**AGENTIC, "task": {"kind": "calc", "calc": {"warmup_direct_frac": 1.5}}}, "task.calc.warmup_direct_frac"),
])
def test_config_errors_name_the_field(data, field):
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_agentic_config_defaults():
    cfg = load_config(AGENTIC)
    assert (cfg.workflow, cfg.task.kind, cfg.agentic.queue, cfg.agentic.affinity) == ("agentic", "calc", "priority",
                                                                                      "prefer")
    assert load_config(None).workflow == "grpo"
