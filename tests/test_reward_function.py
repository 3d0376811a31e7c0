NUM_GPUS = 0
"""reward.function (components/reward/): the spec and its validation at load, what a
call's return becomes, the in-process and the sandboxed runners (sync, async, batched,
named scores; raising, timed-out, NaN calls cost their sample only and are counted),
the step's metrics, and `dynarl train` with a function: it trains the built-in task
exactly as the task's verifier does, a flaky function's failures are counted while the
run ends rc 0, and a bad path is rc 2 with one line naming reward.function."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import assert_reaped
from dynarl import ConfigError
from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.reward.config import RewardSection
from dynarl.components.reward.loading import parse_spec
from dynarl.components.reward.local import LocalReward, batch_outcomes
from dynarl.components.reward.outcome import Outcome, RewardInput, Tally, reward_of
from dynarl.components.reward.sandboxed import SandboxReward, outcomes, records_of, split
from dynarl.components.stage_results import RewardStats
from dynarl.components.tasks.dataset import DatasetConfig, row_metadata
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.step_metrics import function_metrics

TESTS = os.path.dirname(os.path.abspath(__file__))
FNS = os.path.join(TESTS, "reward_fns.py")
REPO = os.path.dirname(TESTS)
EXAMPLE = os.path.join(REPO, "examples", "reward_function.py")


def inputs(*pairs, metadata=None):
    """RewardInputs of (response, answer) pairs, samples 0.. of problem cu-7."""
    return [RewardInput(prompt="a>c:", response=r, answer=a, problem_id="cu-7", sample_id=f"cu-7/{i}",
                        metadata=metadata or {}) for i, (r, a) in enumerate(pairs)]


# ---- the spec and its validation at load --------------------------------------------

@pytest.mark.parametrize("text, target, name", [
    ("pkg.mod:fn", "pkg.mod", "fn"),
    ("mod:_private2", "mod", "_private2"),
    ("path/to/file.py:fn", "path/to/file.py", "fn"),
    ("/abs/my-rewards.py:score", "/abs/my-rewards.py", "score"),
])
def test_spec_forms(text, target, name):
    spec = parse_spec(text)
    assert (spec.target, spec.name, spec.is_file) == (target, name, target.endswith(".py"))


@pytest.mark.parametrize("text", ["mod", "mod:", ":fn", "mod:fn:x", "mod:1fn", "my-mod:fn", "a b.py:", ""])
def test_malformed_specs_are_refused_naming_the_key(text):
    with pytest.raises(ConfigError, match=r"^reward\.function: must be 'module:fn' or 'path/to/file\.py:fn'"):
        load_config(None, [("reward.function", text)])


def test_no_function_is_the_verifier_and_a_relative_file_is_made_absolute(monkeypatch):
    assert load_config().reward.function is None
    monkeypatch.chdir(REPO)
    cfg = load_config(None, [("reward.function", "examples/reward_function.py:count_up")])
    assert cfg.reward.function == f"{EXAMPLE}:count_up"


BROKEN = {"raises.py": "raise RuntimeError('no GPU here')\n", "syntax.py": "def f(:\n    pass\n",
          "imports.py": "import no_such_package_xyz\ndef f(r, a):\n    return 1.0\n"}


@pytest.mark.parametrize("function, extra, message", [
    (f"{FNS}:missing", [], r"has no 'missing'"),
    (f"{FNS}:not_callable", [], r"reward_fns\.py:not_callable is a int, not a function"),
    (f"{FNS}:needs_more", [], r"cannot be called as fn\(response, answer, \*\*context\).*reference_solution"),
    ("/no/such/rewards.py:f", [], r"no file '/no/such/rewards\.py'"),
    ("no_such_module_xyz:f", [], r"cannot import 'no_such_module_xyz'.*or give its file"),
    ("{tmp}/raises.py:f", [], r"loading '.*raises\.py' raised RuntimeError: no GPU here"),
    ("{tmp}/syntax.py:f", [], r"loading '.*syntax\.py' raised SyntaxError"),
    ("{tmp}/imports.py:f", [], r"ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    (f"{FNS}:exact", [("workflow", "agentic"), ("task.kind", "calc")], r"workflow 'agentic' scores its samples itself"),
    # sandbox mode reads and compiles the file, never runs it here
    ("{tmp}/syntax.py:f", [("reward.sandbox", True)], r"syntax\.py line 1: SyntaxError"),
    (f"{FNS}:missing", [("reward.sandbox", True)], r"reward_fns\.py' defines no 'missing' at its top level"),
    ("no_such_module_xyz:f", [("reward.sandbox", True)], r"cannot find module 'no_such_module_xyz'"),
])
def test_a_function_that_does_not_load_is_one_line_naming_the_key(tmp_path, function, extra, message):
    for name, text in BROKEN.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(None, [("reward.function", function.format(tmp=tmp_path)), *extra])
    text = str(info.value)
    assert text.startswith("reward.function: ") and "\n" not in text, text
    assert __import__("re").search(message, text), text


@pytest.mark.parametrize("function, extra", [
    (f"{FNS}:exact", []), (f"{FNS}:everything", []), (f"{FNS}:context", []), (f"{FNS}:batch", [("reward.batched", True)]),
    ("reward_fns:exact_async", []), ("os.path:join", []),
    ("{tmp}/raises.py:f", [("reward.sandbox", True)]),  # its raise is not run here: sandbox mode only compiles it
])
def test_functions_that_load(tmp_path, function, extra):
    (tmp_path / "raises.py").write_text("raise RuntimeError('only in the sandbox')\ndef f(r, a):\n    return 1.0\n")
    cfg = load_config(None, [("reward.function", function.format(tmp=tmp_path)), *extra])
    assert cfg.reward.function.endswith(function.rsplit(":", 1)[1])


@pytest.mark.parametrize("key, value, message", [
    ("timeout_s", 0, "timeout_s: must be in"), ("timeout_s", 7200, "timeout_s: must be in"),
    ("on_error", float("nan"), "on_error: must be a finite number"), ("max_concurrency", 0, "max_concurrency: must be"),
    ("sandbox_memory_mb", 32, "sandbox_memory_mb: must be >= 64"), ("batched", "yes", "batched: expected true or false"),
])
def test_numbers_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=f"^reward.{message}"):
        load_config(None, [(f"reward.{key}", value)])


# ---- what a return becomes ------------------------------------------------------------

@pytest.mark.parametrize("value, reward, scores", [
    (1, 1.0, {}), (0.25, 0.25, {}), (np.float32(0.5), 0.5, {}), (-3, -3.0, {}),
    ({"reward": 0.5, "exact": 1, "gap": -2.0}, 0.5, {"exact": 1.0, "gap": -2.0}),
    ({"reward": 1.0, "text": "skipped", "nan": math.nan, "flag": True}, 1.0, {}),  # non-numbers and NaN scores left out
])
def test_a_number_or_a_mapping_with_a_reward(value, reward, scores):
    assert reward_of(value) == (reward, scores)


@pytest.mark.parametrize("value, message", [
    (math.nan, "returned nan as the value, not a finite number"),
    (math.inf, "returned inf as the value, not a finite number"),
    (True, "returned a bool as the value, not a number"),
    (None, "returned None as the value"),
    ("1.0", "returned a str as the value"),
    ([1.0], "returned a list as the value"),
    ({"score": 1.0}, "returned a mapping without 'reward' (keys: score)"),
    ({"reward": math.nan}, "returned nan as 'reward', not a finite number"),
    ({"reward": "1"}, "returned a str as 'reward'"),
])
def test_anything_else_is_an_error(value, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        reward_of(value)


@pytest.mark.parametrize("value, n, expected", [
    ([1.0, {"reward": 0.5}], 2, [(1.0, ""), (0.5, "")]),
    ((0.0, math.nan), 2, [(0.0, ""), (-1.0, "error")]),
    (np.array([0.5, 0.25]), 2, [(0.5, ""), (0.25, "")]),
    ([1.0], 2, [(-1.0, "error")] * 2),
    (1.0, 2, [(-1.0, "error")] * 2),
    ({"reward": 1.0}, 1, [(-1.0, "error")]),
    (None, 1, [(-1.0, "error")]),
])
def test_a_batched_return_is_a_list_of_as_many_results(value, n, expected):
    got = batch_outcomes(value, n, on_error=-1.0)
    assert [(o.reward, o.failure) for o in got] == expected


def test_tally_counts_failures_keeps_the_first_message_and_sums_scores():
    tally = Tally()
    tally.add("a/0", Outcome(1.0, {"exact": 1.0}))
    tally.add("a/1", Outcome(0.0, {}, "error", "ValueError: boom"))
    tally.add("a/2", Outcome(0.0, {}, "timeout", "slow"))
    tally.add("a/3", Outcome(0.5, {"exact": 0.0, "gap": 2.0}))
    assert (tally.errors, tally.timeouts, tally.first_error) == (1, 1, "sample a/1: ValueError: boom")
    assert tally.scores == {"exact": [1.0, 2], "gap": [2.0, 1]}
    assert tally.summary(4) == ("reward.function failed on 2 of 4 samples this step (1 errors, 1 timeouts; "
                                "their reward: reward.on_error); the first: sample a/1: ValueError: boom")
    assert Tally().summary(4) is None


def test_step_metrics_sum_the_ranks_and_average_each_score_over_its_samples():
    stats = [RewardStats(verifier="function", samples=4, errors=1, timeouts=0, first_error="",
                         scores={"exact": [1.0, 4]}),
             RewardStats(verifier="function", samples=4, errors=2, timeouts=1, first_error="sample b/1: x",
                         scores={"exact": [3.0, 4], "gap": [6.0, 3]})]
    assert function_metrics(stats) == {"reward_errors": 3, "reward_timeouts": 1, "reward_first_error": "sample b/1: x",
                                       "reward_scores": {"exact": 0.5, "gap": 2.0}}
    assert function_metrics([RewardStats(verifier="count_up", samples=4)]) == {}


# ---- in the reward worker's process --------------------------------------------------

@pytest.fixture
def local():
    made = []

    def make(name, **section):
        made.append(LocalReward(RewardSection(function=f"{FNS}:{name}", **section)))
        return made[-1]
    yield make
    for runner in made:
        runner.close()


@pytest.mark.parametrize("name", ["exact", "exact_async"])
async def test_sync_and_async_functions_score_each_sample(local, name):
    got = await local(name).score(inputs(("abc", "abc"), ("ab", "abc"), ("abc", "abc")))
    assert [(o.reward, o.failure) for o in got] == [(1.0, ""), (0.0, ""), (1.0, "")]


async def test_named_scores_come_with_the_reward(local):
    got = await local("named").score(inputs(("abc", "abc"), ("ab", "abc")))
    assert [(o.reward, o.scores) for o in got] == [(1.0, {"length": 3.0}), (0.0, {"length": 2.0})]


async def test_the_context_keywords_its_signature_names_are_passed(local):
    got = await local("context").score(inputs(("abc", "abc"), ("x", "abc"), metadata={"level": 4}))
    assert [o.scores for o in got] == [{"prompt_len": 4.0, "sample": 0.0, "meta": 4.0},
                                       {"prompt_len": 4.0, "sample": 1.0, "meta": 4.0}]
    everything = await local("everything").score(inputs(("a", "a")))
    assert everything[0].scores == {"keys": 4.0}  # prompt, problem_id, sample_id, metadata


@pytest.mark.parametrize("name, expected", [
    ("batch", [(1.0, {}, ""), (0.0, {}, "")]),
    ("batch_async", [(1.0, {"index": 0.0}, ""), (0.0, {"index": 1.0}, "")]),
    ("batch_short", [(-1.0, {}, "error")] * 2),
])
async def test_batched_functions_take_lists(local, name, expected):
    got = await local(name, batched=True, on_error=-1.0).score(inputs(("abc", "abc"), ("ab", "abc")))
    assert [(o.reward, o.scores, o.failure) for o in got] == expected


async def test_raising_nan_and_timed_out_calls_cost_their_sample_only(local):
    runner = local("flaky", timeout_s=0.3, on_error=-1.0)
    started = time.perf_counter()
    got = await runner.score(inputs(*[("abc", "abc")] * 6))
    assert time.perf_counter() - started < 1.4  # the sleeping call (1.5 s) was not waited for
    assert [(o.reward, o.failure) for o in got] == [(1.0, ""), (-1.0, "error"), (-1.0, "error"), (-1.0, "error"),
                                                    (-1.0, "timeout"), (1.0, "")]
    assert got[1].message == "ValueError: no reward for cu-7/1"
    assert got[2].message == "returned nan as the value, not a finite number"
    assert got[4].message == "no result within 0.3 s (reward.timeout_s)"


async def test_an_async_call_past_its_timeout_is_cancelled(local):
    started = time.perf_counter()
    got = await local("slow_async", timeout_s=0.2).score(inputs(("a", "a"), ("b", "b")))
    assert [o.failure for o in got] == ["timeout", "timeout"] and time.perf_counter() - started < 5


async def test_a_hung_sync_call_holds_one_thread_and_not_the_others(local):
    runner = local("hang", timeout_s=0.3, max_concurrency=2)
    release = runner.fn.__globals__["RELEASE"]  # (the file's module, as the runner loaded it)
    release.clear()
    try:
        got = await runner.score(inputs(("hang", "x"), ("ok", "x"), ("ok", "x")))
        assert [o.failure for o in got] == ["timeout", "", ""]
    finally:
        release.set()  # (a daemon thread: the process's exit would not wait for it either)


# ---- in the sandbox -----------------------------------------------------------------

@pytest.fixture
def sandboxed():
    made = []

    def make(name, file=FNS, **section):
        runner = SandboxReward(RewardSection(function=f"{file}:{name}", sandbox=True, **section))
        made.append(runner)
        return runner
    yield make
    for runner in made:
        runner.close()
        assert_reaped(list(runner.sandbox.started_pids))


async def test_the_example_scores_in_the_sandbox_as_in_the_process(sandboxed):
    xs = inputs(("defg", "defg"), ("def", "defg"), ("defgh", "defg"), ("zz", "defg"), ("", "defg"))
    inside = await sandboxed("count_up", file=EXAMPLE, max_concurrency=2).score(xs)
    here = await LocalReward(RewardSection(function=f"{EXAMPLE}:count_up")).score(xs)
    assert inside == here
    assert [o.reward for o in inside] == [1.0, 0.375, 0.4, 0.0, 0.0]


async def test_sandboxed_failures_cost_their_sample_only(sandboxed):
    got = await sandboxed("flaky", timeout_s=0.5, on_error=-1.0, max_concurrency=2).score(inputs(*[("ab", "ab")] * 6))
    assert [(o.reward, o.failure) for o in got] == [(1.0, ""), (-1.0, "error"), (-1.0, "error"), (-1.0, "error"),
                                                    (-1.0, "timeout"), (1.0, "")]
    assert got[1].message == "ValueError: no reward for cu-7/1"
    assert got[2].message == "returned nan as the value, not a finite number"
    assert got[3].message == "returned a str as the value, not a number or a mapping with a 'reward' number"


async def test_a_busy_loop_is_stopped_by_the_sandboxs_timer(sandboxed):
    got = await sandboxed("spin", timeout_s=0.5).score(inputs(("ok", "x"), ("spin", "x"), ("ok", "x")))
    assert [o.failure for o in got] == ["", "timeout", ""]


@pytest.mark.parametrize("name, message", [
    ("network", "forbidden: no network"),
    ("write_outside", "forbidden: write outside the working folder (/var/tmp/dynarl-reward-escape)"),
])
async def test_the_sandbox_holds_the_function_in(sandboxed, name, message):
    got = await sandboxed(name).score(inputs(("a", "a")))
    assert got[0].failure == "error" and message in got[0].message, got[0]
    assert not os.path.exists("/var/tmp/dynarl-reward-escape")


async def test_prints_do_not_disturb_the_results(sandboxed):
    got = await sandboxed("chatty").score(inputs(("a", "a"), ("b", "b")))
    assert [o.reward for o in got] == [1.0, 1.0]


async def test_named_scores_context_and_batches_in_the_sandbox(sandboxed):
    xs = inputs(("abc", "abc"), ("x", "abc"), metadata={"level": 2})
    assert [o.scores for o in await sandboxed("context").score(xs)] == \
        [{"prompt_len": 4.0, "sample": 0.0, "meta": 2.0}, {"prompt_len": 4.0, "sample": 1.0, "meta": 2.0}]
    batched = await sandboxed("batch_async", batched=True).score(xs)
    assert [(o.reward, o.scores) for o in batched] == [(1.0, {"index": 0.0}), (0.0, {"index": 1.0})]
    short = await sandboxed("batch_short", batched=True).score(xs)
    assert [o.message for o in short] == ["a batched call returned 1 results for 2 samples"] * 2


async def test_a_file_that_fails_to_load_inside_fails_every_sample(sandboxed, tmp_path):
    (tmp_path / "needs.py").write_text("import no_such_package_xyz\ndef f(r, a):\n    return 1.0\n")
    got = await sandboxed("f", file=str(tmp_path / "needs.py")).score(inputs(("a", "a"), ("b", "b")))
    assert all(o.failure == "error" and "ModuleNotFoundError" in o.message for o in got), got


@pytest.mark.parametrize("records, timed_out, expected", [
    ([{"i": 0, "value": 1.0}, {"i": 1, "error": "E: x"}], False, [(1.0, ""), (-1.0, "error")]),
    ([{"i": 1, "value": 0.5}], True, [(-1.0, "timeout"), (0.5, "")]),  # the sandbox was stopped for time
    ([{"i": 1, "value": 0.5}], False, [(-1.0, "error"), (0.5, "")]),  # it crashed (memory, say)
    ([{"i": -1, "timeout": True}], False, [(-1.0, "timeout")] * 2),  # a batched call's
    ([{"i": -1, "value": [1.0, 0.0]}], False, [(1.0, ""), (0.0, "")]),
    ([{"load_error": "loading x raised E"}, {"i": 0, "value": 1.0}], False, [(-1.0, "error")] * 2),
    ([{"i": 7, "value": 1.0}, {"i": 0, "value": "x"}], False, [(-1.0, "error"), (-1.0, "error")]),
])
def test_the_drivers_records_become_outcomes(records, timed_out, expected):
    got = outcomes(records, 2, RewardSection(on_error=-1.0), "the sandbox ended", timed_out)
    assert [(o.reward, o.failure) for o in got] == expected


def test_only_marked_lines_are_records():
    out = '\x1edynarl-reward {"i": 0, "value": 1}\nnoise\n\x1edynarl-reward {broken\n\x1edynarl-reward [1]\n'
    assert records_of(out) == [{"i": 0, "value": 1}]


@pytest.mark.parametrize("n, parts, sizes", [(10, 3, [4, 3, 3]), (2, 8, [1, 1]), (0, 4, [0]), (5, 1, [5])])
def test_split_in_order_near_equal(n, parts, sizes):
    got = split(list(range(n)), parts)
    assert [len(p) for p in got] == sizes and [x for p in got for x in p] == list(range(n))


# ---- what the function sees of a dataset row -----------------------------------------

@pytest.mark.parametrize("row, expected", [
    ({"prompt": "p", "answer": "a"}, None),
    ({"prompt": "p", "answer": "a", "level": 3, "tests": ["assert f(1) == 2"]}, {"level": 3, "tests": ["assert f(1) == 2"]}),
    ({"prompt": "p", "answer": "a", "blob": b"\x00", "when": __import__("datetime").date(2024, 1, 1), "ok": None},
     {"ok": None}),  # what JSON cannot hold is left out
])
def test_a_rows_other_fields_are_its_metadata(row, expected):
    assert row_metadata(row, DatasetConfig(path="x.jsonl")) == expected


def test_a_groups_metadata_crosses_the_wire_and_checkpoints():
    from dynarl.transport.wire import decode_blob, encode_blob
    group = PromptGroup(2, "e0:r4", "42", [1, 2], [Sample("e0:r4/0", 1)], {"level": 3})
    assert decode_blob(encode_blob(group)).metadata == {"level": 3}
    back = PromptGroup.from_json(json.loads(json.dumps(group.to_json())))
    assert back.metadata == {"level": 3} and back.samples[0].id == "e0:r4/0"
    older = group.to_json()[:5]  # a checkpoint written before metadata existed
    assert PromptGroup.from_json(older).metadata is None


# ---- dynarl train ---------------------------------------------------------------------

FAST = ["run.steps=2", "run.prompts_per_step=4", "trainer.warmup.steps=2", "run.checkpoint_every=100"]


def train(tmp_path, name, *args, timeout=600):
    run = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *FAST, *args, "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] \
        if (run / "metrics.jsonl").exists() else []
    return done, rows


def test_a_function_trains_the_built_in_task_as_its_verifier_does(tmp_path):
    """The example reimplements the task's partial credit: the same samples get the same
    rewards, so the run is the verifier's, step for step; its named scores are logged."""
    done, rows = train(tmp_path, "function", "reward.function=examples/reward_function.py:count_up")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    base, verifier = train(tmp_path, "verifier")
    assert base.returncode == 0, base.stderr[-3000:]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in verifier]
    assert [r["loss"] for r in rows] == [r["loss"] for r in verifier]
    for r in rows:
        assert (r["verifier"], r["reward_errors"], r["reward_timeouts"], r["reward_first_error"]) == \
            ("function", 0, 0, None)
        assert set(r["reward_scores"]) == {"exact", "length_gap"} and r["reward_scores"]["exact"] == r["exact_frac"]
    assert "reward_errors" not in verifier[0] and verifier[0]["verifier"] == "count_up"


def test_a_flaky_function_costs_its_samples_and_the_run_ends_rc_0(tmp_path):
    """Of each group's 8 samples, 3 fail (raise, NaN, a string) and 1 times out: counted
    every step, the first message kept, one log line per step; the run trains to the end."""
    done, rows = train(tmp_path, "flaky", f"reward.function={FNS}:flaky", "reward.timeout_s=0.5",
                       "reward.on_error=0.0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert (r["reward_errors"], r["reward_timeouts"], r["samples"]) == (3 * 4, 4, 32)
        assert r["reward_first_error"].startswith("sample cu-")
    logged = [line for line in (done.stdout + done.stderr).splitlines() if "reward.function failed on" in line]
    assert len(logged) == 2 and "16 of 32 samples" in logged[0], logged


def test_a_sandboxed_function_trains(tmp_path):
    done, rows = train(tmp_path, "sandbox", "reward.function=examples/reward_function.py:count_up",
                       "reward.sandbox=true", "run.steps=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert rows[0]["reward_errors"] == 0 and set(rows[0]["reward_scores"]) == {"exact", "length_gap"}


def test_a_dataset_rows_metadata_reaches_the_function(tmp_path):
    """Each row's other fields reach the function with its own sample (rollout, then the
    reward worker, over the wire), and the prompt is the row's as the model saw it."""
    from grpo_tiny import TINY
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a, "row": 4 * a + b + 1, "text": f"{a}+{b}="}
            for a in range(4) for b in range(4)]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tiny = [a for a in TINY if not a.startswith("task.count_up")]
    done, metrics = train(tmp_path, "dataset", *tiny, "task.kind=dataset", f"task.dataset.path={tmp_path / 'math.jsonl'}",
                          "rollout.max_new_tokens=4", f"reward.function={FNS}:by_row")
    assert done.returncode == 0, done.stderr[-3000:]
    for m in metrics:
        scores = m["reward_scores"]
        assert (scores["row_matches"], scores["prompt_matches"], m["reward_errors"]) == (1.0, 1.0, 0), m
        assert 0 <= scores["level"] <= 3


def test_ppo_takes_the_same_reward_stage():
    from dynarl.components.reward.worker import RewardWorker
    from dynarl.components.workflows.ppo import PPO
    assert PPO.reward_worker is RewardWorker
    cfg = load_config(None, [("workflow", "ppo"), ("reward.function", f"{FNS}:exact")])
    assert cfg.reward.function == f"{FNS}:exact"


@pytest.mark.parametrize("function, message", [
    ("examples/no_such_file.py:count_up", "no file"),
    ("examples/reward_function.py:no_such_fn", "has no 'no_such_fn'"),
])
def test_a_bad_path_is_rc_2_and_one_line_naming_reward_function(tmp_path, function, message):
    done, rows = train(tmp_path, "bad", f"reward.function={function}", timeout=120)
    assert done.returncode == 2 and rows == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dynarl train: error: reward.function: ") and message in lines[0], \
        done.stderr
