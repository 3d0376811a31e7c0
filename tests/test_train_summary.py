"""The end-of-run summary: first and last N steps, with N what it really is."""
import json

import pytest

from dynarl.launch.train import summarize, summary_window


@pytest.mark.parametrize("steps, window", [(1, 1), (2, 1), (5, 2), (19, 9), (20, 10), (200, 10)])
def test_the_window_never_lets_first_and_last_overlap(steps, window):
    assert summary_window(steps) == window


def test_a_five_step_run_compares_its_first_two_with_its_last_two_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "reward_mean": float(i), "tokens_per_s": 1.0,
                                        "step_time_s": 1.0}) + "\n" for i in range(5)))
    summary = summarize(str(path), 3.0)
    assert (summary["window"], summary["reward_first"], summary["reward_last"]) == (2, 0.5, 3.5)
