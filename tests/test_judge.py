NUM_GPUS = 0
"""The LLM judge (judge: section): its score parser, its template, how its score
becomes the reward, its config errors (one line naming the field, rc 2), and a short
real `dynarl train` with the tiny model as its own judge, time-sharing device 0 with
the colocated components: it trains, metrics.jsonl holds the judge's counts, and the
placement line, the stage spans, trace.json and graph.json hold the judge."""

import json
import math
import os

import pytest

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.extras import is_available
from dynarl.components.reward.judge_config import JudgeSection
from dynarl.components.reward.judge_score import combine, parse_score, render, template_problem
from dynarl.components.reward.judge_worker import Tally, judge_group, spellable
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.launch.train import main as train_main
from grpo_tiny import overrides


# ---- the score parser -----------------------------------------------------------------

NUMBER = r"-?\d+(?:\.\d+)?"


@pytest.mark.parametrize("text,kind,pattern,low,high,expected", [
    ("7", "number", NUMBER, 0, 10, 0.7),
    ("Score: 10", "number", NUMBER, 0, 10, 1.0),
    ("0 out of 10", "number", NUMBER, 0, 10, 0.0),  # the first number is the score
    ("2.5", "number", NUMBER, 0, 10, 0.25),
    ("11", "number", NUMBER, 0, 10, None),  # outside [low, high]: no score
    ("-1", "number", NUMBER, 0, 10, None),
    ("-1", "number", NUMBER, -1, 1, 0.0),  # a range of its own
    ("no digits here", "number", NUMBER, 0, 10, None),
    ("", "number", NUMBER, 0, 10, None),
    ("73", "number", r"\d", 0, 9, 7 / 9),  # one digit
    ("rating=4/5", "number", r"rating=(\d)", 1, 5, 0.75),  # the group is the score
    ("rating=x", "number", r"rating=(\w)", 1, 5, None),  # a group that is no number
    ("Yes, it is right.", "yes_no", NUMBER, 0, 10, 1.0),
    ("NO.", "yes_no", NUMBER, 0, 10, 0.0),
    ("I'd say no; yes is wrong", "yes_no", NUMBER, 0, 10, 0.0),  # the first word
    ("yesterday, nothing", "yes_no", NUMBER, 0, 10, None),  # words, not substrings
    ("", "yes_no", NUMBER, 0, 10, None),
])
def test_parse_score(text, kind, pattern, low, high, expected):
    got = parse_score(text, kind, pattern, low, high)
    assert got == pytest.approx(expected) if expected is not None else got is None


# ---- the template ---------------------------------------------------------------------

@pytest.mark.parametrize("template,problem", [
    ("Q: {prompt}\nA: {response}\nRef: {answer}", None),
    ("{response}", None),
    ('Answer as JSON {"score": 5}: {response}', None),  # a brace that is not a placeholder is text
    ("Q: {prompt}\nRef: {answer}", "must contain {response}"),
    ("Q: {prompt}\nA: {respones}", "unknown placeholder {respones}"),
    ("{question} {response}", "unknown placeholder {question}"),
])
def test_template_problem(template, problem):
    got = template_problem(template)
    assert got is None if problem is None else problem in got


@pytest.mark.parametrize("template,parts,expected", [
    ("Q: {prompt} A: {response} R: {answer}", ("a>c:", "abc", "abc"), "Q: a>c: A: abc R: abc"),
    ("{response}{response}", ("p", "x", "y"), "xx"),
    ('{"score": N} {response}', ("p", "r", "a"), '{"score": N} r'),
    # a part's own text is never read as a placeholder: the reference does not leak in
    ("A: {response} R: {answer}", ("p", "{answer}", "SECRET"), "A: {answer} R: SECRET"),
])
def test_render(template, parts, expected):
    prompt, response, answer = parts
    assert render(template, prompt=prompt, response=response, answer=answer) == expected


def test_spellable_replaces_what_a_character_tokenizer_cannot_spell():
    tok = CharTokenizer()
    assert spellable(tok, "ab\ufffdc") == "ab?c"
    tok.encode(spellable(tok, "caf\u00e9 \ufffd"))  # (raises on a character it cannot spell)
    assert spellable(object(), "\ufffd") == "\ufffd"  # other tokenizers spell anything


# ---- the reward -----------------------------------------------------------------------

@pytest.mark.parametrize("reward,score,how,weight,expected", [
    (1.0, 0.3, "replace", 0.5, 0.3),
    (0.0, 0.3, "replace", 0.9, 0.3),
    (1.0, 0.0, "weight", 0.5, 0.5),
    (1.0, 1.0, "weight", 0.25, 1.0),
    (0.0, 1.0, "weight", 0.25, 0.25),
    (0.8, 0.2, "weight", 0.0, 0.8),  # weight 0: the judge is only measured
])
def test_combine(reward, score, how, weight, expected):
    assert combine(reward, score, how, weight) == pytest.approx(expected)


def test_judge_group_scores_counts_and_combines():
    """Each sample: judged (parsed), judged with no score (default), or not judged (too
    long: default); the reward is the combination, and the tally counts each kind."""
    judge = JudgeSection(combine="weight", weight=0.5)
    judge.parser.default = 0.2
    samples = [Sample(f"g/{k}", k, output_ids=[5, 6], reward=r) for k, r in enumerate((1.0, 0.0, 1.0))]
    group = PromptGroup(0, "g", "abc", [1, 2], samples)
    tally = Tally()
    judge_group(group, {"g/0": ("8", 1), "g/1": ("gibberish", 8)}, judge, tally)  # g/2 was too long
    assert [s.reward for s in samples] == pytest.approx([0.5 * 1.0 + 0.5 * 0.8, 0.5 * 0.0 + 0.5 * 0.2,
                                                         0.5 * 1.0 + 0.5 * 0.2])
    stats = tally.stats()
    assert (stats.samples, stats.unparseable, stats.too_long, stats.tokens) == (3, 1, 1, 9)
    assert stats.score_sum == pytest.approx(0.8 + 0.2 + 0.2) and stats.reward_before_sum == 2.0
    assert stats.example == "8"


# ---- config errors: one line naming the field, rc 2 -------------------------------------

@pytest.mark.parametrize("args,field", [
    (["judge.devices=[]"], "judge.devices"),
    (["judge.devices=0"], "judge.devices"),
    (["judge.devices=[5]"], "judge.devices"),  # not in the 2-device cluster
    (["judge.devices=[0, 0]"], "judge.devices"),
    (["judge.backend=tgi"], "judge.backend"),
    (["judge.template=Rate {prompt}"], "judge.template"),
    (["judge.template=Rate {respons}"], "judge.template"),
    (["judge.parser.pattern=(\\d"], "judge.parser.pattern"),
    (["judge.parser.low=5", "judge.parser.high=5"], "judge.parser.high"),
    (["judge.weight=1.5"], "judge.weight"),
    (["judge.model=/no/such/folder"], "judge.model"),
    (["judge.max_prompt_tokens=2047"], "judge.max_prompt_tokens"),  # + 8 new tokens > the 2048 positions
    (["workflow=agentic", "task.kind=calc"], "judge.enabled"),
    # the dynarl scheduler moves devices 0..2 among the placement's components, never the judge's
    (["scheduler.policy=dynarl", "runtime.cluster.devices_per_node=4", "placement.mode=hybrid",
      "rollout.num_ranks=2", "inference.num_ranks=1", "trainer.num_ranks=1", "judge.devices=[2]"], "judge.devices"),
])
def test_a_bad_judge_config_is_one_line_naming_the_field_rc_2(args, field, capsys):
    assert train_main(["judge.enabled=true", *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dynarl train: error: {field}:") and err.count("\n") == 1, err


@pytest.mark.skipif(is_available("vllm"), reason="vllm is installed here")
def test_a_judge_backend_whose_extra_is_missing_names_the_pip_command(capsys):
    assert train_main(["judge.enabled=true", "judge.backend=vllm", "run.steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynarl train: error: judge.backend:") and "pip install 'dynarl[vllm]'" in err


@pytest.mark.parametrize("args,placed", [
    ([], "trainer [0], judge [0] (time-shared)"),
    (["runtime.cluster.devices_per_node=3", "judge.devices=[2]"], "trainer [0], judge [2] (own)"),
    (["runtime.cluster.devices_per_node=5", "placement.mode=hybrid", "rollout.num_ranks=2",
      "inference.num_ranks=1", "trainer.num_ranks=1", "scheduler.policy=dynarl", "judge.devices=[4]"],
     "trainer [2], judge [4] (own)"),
])
def test_the_dry_run_places_the_judge(args, placed, capsys):
    assert train_main(["judge.enabled=true", *args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert placed in out, out


def test_no_judge_no_judge_on_the_placement_line(capsys):
    assert train_main(["--dry-run"]) == 0
    assert "judge" not in capsys.readouterr().out


# ---- a real run: the tiny model judges itself ---------------------------------------------

STEPS = 2


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    """Colocated on device 0, the judge time-sharing it; sampled judgments (temperature
    1: some hold a digit, most do not), weighed half into the reward, default 0.5."""
    from dynarl.launch.train import prepare
    run_dir = str(tmp_path_factory.mktemp("judged"))
    job = prepare(None, overrides("judge.enabled=true", f"run.steps={STEPS}", "trainer.warmup.steps=2",
                                  "judge.temperature=1.0", "judge.combine=weight", "judge.weight=0.5",
                                  "judge.parser.default=0.5"), run_dir, None)
    assert job.run() == 0
    return job, run_dir


def test_a_judged_run_trains_and_counts_its_judgments(judged_run):
    _, run_dir = judged_run
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        assert r["judge_samples"] == r["samples"] == 8 * 4
        assert 0 < r["judge_unparseable"] < r["judge_samples"], r  # some judgments hold a score, some none
        assert r["judge_too_long"] == 0 and r["judge_tokens"] > 0 and r["judge_s"] > 0
        assert 0.0 <= r["judge_score_mean"] <= 1.0
        # the trained reward is the judge's score weighed into the verifier's
        assert r["reward_mean"] == pytest.approx(0.5 * r["reward_before_judge_mean"] + 0.5 * r["judge_score_mean"])
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])  # a train step on the judged rewards
    assert os.path.isfile(os.path.join(run_dir, "timeline.png"))


def test_the_judge_time_shares_device_0_between_rollout_and_the_trainer(judged_run):
    job, _ = judged_run  # (on-policy grpo: no inference stage, old_logprobs.py)
    spans = job.workflow.clock.spans
    for step in range(STEPS):
        by = {s.component: s for s in spans if s.label == f"step {step}"}
        judge = by["judge"]
        assert judge.devices == [0] and "inference" not in by
        assert by["rollout"].end <= judge.start and judge.end <= by["trainer"].start


def test_the_trace_and_the_graph_hold_the_judge(judged_run):
    from conftest import assert_reaped
    job, run_dir = judged_run
    trace = json.load(open(os.path.join(run_dir, "trace.json")))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    on_judge_track = {e["name"] for e in events if tracks.get(e.get("pid")) == "stage/judge" and e.get("ph") == "X"}
    assert {f"score step {s}" for s in range(STEPS)} <= on_judge_track, on_judge_track
    graph = json.load(open(os.path.join(run_dir, "graph.json")))
    node = next(n for n in graph["nodes"] if n["name"] == "judge")
    assert node["cls"] == "JudgeWorker" and node["devices"] == [0]
    edges = {e["channel"]: e for e in graph["edges"]}
    assert "reward" in edges["rewarded"]["producers"] and edges["rewarded"]["consumers"] == ["judge"]
    assert "judge" in edges["scored"]["producers"] and "reward" not in edges["scored"]["producers"]
    assert_reaped([p for g in job.workflow.worker_groups() for p in g.pids])


def test_under_dynarl_the_placement_moves_and_the_judge_keeps_its_own_device(tmp_path):
    """scheduler.policy=dynarl (test_dynarl_train.py's job, one step) with the judge on
    device 4 of its own: rollout devices go to the trainer in the tail and come back,
    every sample is judged, and no move touches device 4."""
    from dynarl.launch.train import prepare
    from test_dynarl_train import FAST, JOB
    job = prepare(None, overrides(*JOB, "run.steps=1", "runtime.cluster.devices_per_node=5", "scheduler.policy=dynarl",
                                  *FAST, "judge.enabled=true", "judge.devices=[4]"), str(tmp_path / "run"), None)
    assert job.run() == 0
    [row] = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert row["migrations"].get("workload:rollout", 0) >= 1 and row["judge_samples"] == row["samples"]
    spans = [s for s in job.workflow.clock.spans if s.label == "step 0"]
    assert {tuple(s.devices) for s in spans if s.component == "judge"} == {(4,)}
    assert all(4 not in s.devices for s in spans if s.component != "judge")
