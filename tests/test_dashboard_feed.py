NUM_GPUS = 0
"""The dashboard's data: what a run writes for it (spans.jsonl, samples_text.jsonl), how
the dashboard reads it while it grows (run_files.py), and the views it serves (feed.py),
with the step's moves as the console says them (step_moves.py)."""

import json

import pytest

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.workflows.sample_text import decoder, picked, step_samples, turns
from dynarl.components.workflows.span_log import SpanLog, read, spans_of
from dynarl.components.workflows.stages import Span
from dynarl.launch.dashboard import feed
from dynarl.launch.dashboard.run_files import JsonlTail
from dynarl.launch.step_moves import moves_of, moves_text


def plan(at, rel, moves, current=4.0, predicted=1.5, measured=5.0):
    return {"at_s": at, "at_vs_rollout_end_s": rel, "moves": moves, "predicted_s": predicted,
            "current_s": current, "migration_cost_s": 0, "measured_s": measured, "candidates": 2}


def dynarl_row(step, reward, t):
    """A dynarl step's metrics row: rollout ends at loop time t + 2; two moves."""
    held = {"mean": 2.0, "min": 1.0, "max": 3.0}
    return {"step": step, "reward_mean": reward, "exact_frac": 0.5, "loss": 0.1 * step, "kl": 0.01,
            "staleness_mean": 0.0, "staleness_max": 0, "tokens_per_s": 500.0, "step_time_s": 5.0, "time": 1e9 + step,
            "migrations": {"workload:rollout": 1, "p2p:trainer": 2}, "migration_s": {"p2p:trainer": 0.5},
            "migrations_in_tail": 1, "decisions": 4, "devices": {"rollout": held, "trainer": held},
            "plans": [plan(t + 1.9, -0.1, [["rollout", "trainer", 2]]),
                      plan(t + 2.5, 0.5, [["inference", "trainer", 1]], current=1.0, predicted=0.5, measured=0.75)],
            "device_counts_vs_rollout_end_s": [[-0.1, {"rollout": 1, "trainer": 3}],
                                               [3.0, {"rollout": 3, "trainer": 1}]]}


def step_spans(step, t):
    label = f"step {step}"
    return [Span("rollout", [0], t, t + 2.0, label), Span("rollout", [1, 2], t, t + 1.9, f"{label} released"),
            Span("migrate p2p", [1, 2], t + 1.9, t + 2.1, label), Span("reward", [], t + 0.1, t + 2.0, label),
            Span("trainer", [3, 1, 2], t + 2.1, t + 4.0, label), Span("sync", [], t + 4.0, t + 4.2, label),
            Span("trainer", [3], t + 4.2, t + 4.5, f"checkpoint {step + 1}")]


ROWS = [dynarl_row(0, 0.25, 100.0), dynarl_row(1, 0.5, 110.0)]
SPANS = [Span("trainer", [3], 90.0, 95.0, "warmup"), *step_spans(0, 100.0), *step_spans(1, 110.0)]


# --- step_moves: the console's words for a step's moves ------------------------------

@pytest.mark.parametrize("row, moves, text", [
    ({"step": 0}, {}, ""),  # policy static: no scheduler figures
    ({"step": 0, "plans": []}, {}, "moves 0"),
    ({"plans": [{"moves": [["rollout", "trainer", 2]]}, {"moves": [["rollout", "trainer", 1]]}],
      "devices": {"trainer": {"mean": 2.5, "min": 1.0, "max": 4.0}}},
     {"rollout->trainer": 3}, "moves 3 (rollout->trainer 3)  trainer 1-4 dev"),
    ({"plans": [{"moves": [["rollout", "trainer", 2], ["rollout", "inference", 1]]}]},
     {"rollout->trainer": 2, "rollout->inference": 1}, "moves 3 (rollout->trainer 2, rollout->inference 1)"),
])
def test_a_steps_moves_by_donor_and_receiver(row, moves, text):
    assert moves_of(row) == moves
    assert moves_text(row) == text


def test_the_console_step_line_shows_the_moves_under_dynarl():
    from dynarl.launch.progress import step_line
    base = dict(step=0, reward_mean=0.5, exact_frac=0.5, response_len_mean=4.0, response_len_max=8, tokens_per_s=100.0,
                step_time_s=1.0, rollout_s=0.2, reward_s=0.1, inference_s=0.1, trainer_s=0.5, sync_s=0.1)
    line = step_line(dict(base, plans=[{"moves": [["rollout", "trainer", 3]]}],
                          devices={"trainer": {"mean": 2.0, "min": 1.0, "max": 4.0}}), 2, eta_s=10.0)
    assert line.endswith("moves 3 (rollout->trainer 3)  trainer 1-4 dev  eta 10s")
    assert "moves" not in step_line(base, 2)


# --- sample_text: run.log_samples' records ----------------------------------------------

@pytest.mark.parametrize("total, n, expected", [
    (8, 0, []), (8, 3, [0, 2, 5]), (8, 8, list(range(8))), (3, 5, [0, 1, 2]), (0, 2, []),
])
def test_the_logged_samples_spread_over_the_batch(total, n, expected):
    assert picked(total, n) == expected


@pytest.mark.parametrize("ids, mask, expected", [
    ([5, 6, 7], None, None),
    ([5, 6, 7, 8, 9], [1, 1, 0, 0, 1], [("model", "cd"), ("tool", "ef"), ("model", "g")]),
    ([5], [0], [("tool", "c")]),
])
def test_a_multi_turn_response_splits_into_model_and_tool_turns(ids, mask, expected):
    tok = CharTokenizer("abcdefg")
    got = turns(ids, mask, lambda x: tok.decode(x, skip_special=False))
    assert got == (None if expected is None else [{"role": r, "text": t} for r, t in expected])


def test_an_id_the_tokenizer_cannot_spell_is_shown_as_its_number():
    # (the tiny model's vocabulary is larger than a small task alphabet's tokenizer)
    decode = decoder(CharTokenizer("ab"))
    assert decode([3, 4, 2]) == "ab<eos>" and decode([3, 99, 2]) == "a<id 99><eos>"


def test_a_steps_samples_as_text():
    tok = CharTokenizer("abcxyz")
    prompt = tok.encode("ab", add_bos=True)

    def sample(i, reward):
        out = tok.encode("xy") + [tok.eos_id]
        return Sample(f"g/{i}", i, output_ids=out, logprobs=[-0.1, -0.2, -0.3], finish="stop", version=2,
                      reward=reward, advantage=reward - 0.5, old_logprobs=[-0.1, -0.25, -0.3])
    groups = [PromptGroup(1, "p1", "c", prompt, [sample(2, 1.0), sample(3, 0.0)]),
              PromptGroup(0, "p0", "c", prompt, [sample(0, 0.5), sample(1, 0.0)])]
    line = step_samples(4, groups, tok, 2)
    assert line["step"] == 4 and [s["id"] for s in line["samples"]] == ["g/0", "g/2"]  # groups by index, spread
    s = line["samples"][1]
    assert (s["prompt"], s["response"], s["tokens"]) == ("<bos>ab", "xy<eos>", ["x", "y", "<eos>"])
    assert (s["reward"], s["advantage"], s["finish"], s["version"], s["group"]) == (1.0, 0.5, "stop", 2, 1)
    assert s["logprobs"] == [-0.1, -0.2, -0.3] and s["old_logprobs"] == [-0.1, -0.25, -0.3] and s["turns"] is None
    json.dumps(line)  # one JSON line


# --- span_log: spans.jsonl -------------------------------------------------------------

def test_spans_are_written_a_line_per_step_and_a_step_trained_again_replaces_its_line(tmp_path):
    log = SpanLog(str(tmp_path))
    clock = [Span("trainer", [0], 0.0, 1.0, "warmup"), Span("rollout", [0], 1.0, 2.0, "step 0")]
    log.write(0, clock)
    clock.append(Span("rollout", [0], 2.0, 3.0, "step 1"))
    log.write(1, clock)
    assert [s.label for s in read(str(tmp_path))] == ["warmup", "step 0", "step 1"]
    again = SpanLog(str(tmp_path))  # a restart from step 1's checkpoint: a new clock
    again.write(1, [Span("rollout", [1], 9.0, 9.5, "step 1")])
    spans = read(str(tmp_path))
    assert [(s.label, s.devices) for s in spans] == [("warmup", [0]), ("step 0", [0]), ("step 1", [1])]
    SpanLog(None).write(0, clock)  # a simulation: no run directory, no file
    assert spans_of([]) == []


# --- run_files: reading files as they grow ---------------------------------------------

def test_a_growing_file_is_read_by_what_was_appended(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(str(path))
    assert tail.records() == []  # not written yet
    path.write_text('{"step": 0}\n{"step": 1')  # the writer is mid-line
    assert tail.records() == [{"step": 0}]
    with open(path, "a") as f:
        f.write('}\n{"step": 2}\n')
    assert tail.records() == [{"step": 0}, {"step": 1}, {"step": 2}]
    replaced = tmp_path / "new.jsonl"  # a resume's roll back: a new file in its place
    replaced.write_text('{"step": 0, "again": true}\n')
    replaced.replace(path)
    assert tail.records() == [{"step": 0, "again": True}]


# --- feed: the views -------------------------------------------------------------------

def test_the_curves_are_the_metrics_per_step_counted_from_1():
    charts = {c["id"]: c for c in feed.curves(ROWS, SPANS)}
    assert charts["reward"]["x"] == [1, 2]
    series = {s["key"]: s["values"] for s in charts["reward"]["series"]}
    assert series == {"reward_mean": [0.25, 0.5], "exact_frac": [0.5, 0.5]}  # success_rate: no step has it
    assert [s["key"] for s in charts["staleness"]["series"]] == ["staleness_mean", "staleness_max"]
    assert {s["key"]: s["values"] for s in charts["devices"]["series"]}["devices.trainer.max"] == [3.0, 3.0]
    assert charts["moves"]["series"][0]["values"] == [3.0, 3.0]
    stages = {s["label"]: s["values"] for s in charts["stages"]["series"]}
    assert charts["stages"]["x"] == [1, 2] and stages["trainer"] == pytest.approx([1.9, 1.9])
    assert "kl" not in {c["id"] for c in feed.curves([{"step": 0, "reward_mean": 1.0}], [])}


def test_each_plan_has_its_predicted_and_measured_gain():
    m = feed.migrations(ROWS + [{"step": 2, "reward_mean": 0.1}])  # a static step: no plans
    assert [s["step"] for s in m["steps"]] == [0, 1]
    assert m["steps"][0]["moves"] == {"rollout->trainer": 2, "inference->trainer": 1}
    first = m["plans"][0]
    assert (first["moves"], first["predicted_gain_s"], first["measured_gain_s"]) == ("rollout->trainer 2", 2.5, -1.0)
    assert m["plans"][1]["predicted_gain_s"] == 0.5 and m["plans"][1]["measured_gain_s"] == 0.25


def test_a_steps_view_is_its_spans_moves_and_device_counts_since_it_began():
    view = feed.step_view(ROWS, SPANS, None, 4)  # the last step
    assert (view["step"], view["steps"], view["devices"]) == (1, [0, 1], 4)
    assert view["duration_s"] == pytest.approx(4.2)  # (the checkpoint after it is not the step's)
    trainer = next(s for s in view["spans"] if s["component"] == "trainer")
    assert trainer["devices"] == [3, 1, 2] and trainer["start"] == pytest.approx(2.1)
    assert [m["text"] for m in view["moves"]] == ["rollout->trainer 2", "inference->trainer 1"]
    assert [m["at"] for m in view["moves"]] == pytest.approx([1.9, 2.5])
    # rollout ended at 112.0 (at_s - at_vs_rollout_end_s); the step began with step 0's last counts
    assert [c["at"] for c in view["counts"]] == pytest.approx([0.0, 1.9, 5.0])
    assert [c["counts"]["rollout"] for c in view["counts"]] == [3, 1, 3]
    first = feed.step_view(ROWS, SPANS, 0, 4)
    assert first["counts"][0]["at"] == pytest.approx(1.9)  # no step before it
    assert feed.step_view(ROWS, SPANS, 7, 4) is None and feed.step_view([], [], None, 4) is None


LOGGED = [{"step": 0, "samples": [{"id": "a", "reward": 0.0, "prompt": "p", "response": "r", "tokens": ["r"]},
                                  {"id": "b", "reward": 1.0, "prompt": "p", "response": "s", "turns": [{}, {}]}]},
          {"step": 1, "samples": [{"id": "c", "reward": 0.5}, {"id": "d", "reward": None}]},
          {"step": 0, "samples": [{"id": "a2", "reward": 0.75}]}]  # step 0 logged again (a restart)


@pytest.mark.parametrize("step, lo, hi, ids", [
    (None, None, None, ["c", "d", "a2"]),  # the newest step first; step 0's last line
    (None, 0.5, None, ["c", "a2"]),
    (None, None, 0.6, ["c"]),
    (1, None, None, ["c", "d"]),
    (1, 0.6, 1.0, []),
])
def test_the_samples_filter_by_step_and_reward(step, lo, hi, ids):
    out = feed.samples(LOGGED, step, lo, hi)
    assert [s["id"] for s in out["samples"]] == ids and out["total"] == len(ids) and out["steps"] == [0, 1]
    assert all("tokens" not in s for s in out["samples"])  # the list is light; sample() has it all


def test_one_sample_whole_and_the_list_bounded():
    assert feed.sample(LOGGED[:1], 0, "a")["tokens"] == ["r"] and feed.sample(LOGGED, 0, "a") is None
    assert feed.samples(LOGGED[:1], limit=1)["total"] == 2 and len(feed.samples(LOGGED[:1], limit=1)["samples"]) == 1
    assert feed.samples(LOGGED[:1])["samples"][1]["turns"] == 2


def test_the_summary_reads_the_config():
    config = {"workflow": "grpo", "scheduler": {"policy": "dynarl"}, "run": {"steps": 10, "log_samples": 4},
              "runtime": {"cluster": {"num_nodes": 2, "devices_per_node": 4, "device_kind": "cpu"}}}
    s = feed.summary(ROWS, config, "/r", True)
    assert (s["steps_done"], s["steps_total"], s["last_step"], s["num_devices"], s["scheduler"]) == \
        (2, 10, 1, 8, "dynarl")
    assert s["colours"]["trainer"] and feed.summary([], {}, "/r", False)["num_devices"] is None
