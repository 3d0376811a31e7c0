"""timeline.png for long runs: the last steps in detail, every step in a strip."""
import pytest

from dynarl.components.workflows.stages import Span
from dynarl.launch.timeline import DETAIL_STEPS, detail, draw_timeline, stage_seconds, step_of


def run_spans(steps: int) -> list[Span]:
    spans = [Span("trainer", [0, 1], 0.0, 5.0, "warmup")]
    for n in range(steps):
        t = 10.0 + 3 * n
        spans += [Span("rollout", [0], t, t + 1.0, f"step {n}"), Span("rollout", [1], t, t + 1.5, f"step {n}"),
                  Span("reward", [], t + 0.2, t + 1.6, f"step {n}"), Span("trainer", [0, 1], t + 1.6, t + 2.5, f"step {n}"),
                  Span("migrate p2p", [1], t + 1.0, t + 1.2, f"step {n}")]
    return spans


def test_step_of_reads_step_labels_only():
    assert [step_of(x) for x in ("step 12", "step 3 released", "warmup", "checkpoint 4", "step x")] == \
        [12, 3, None, None, None]


def test_the_detail_is_the_last_steps_and_the_strip_every_step():
    spans = run_spans(30)
    shown, steps = detail(spans)
    assert steps == list(range(30 - DETAIL_STEPS, 30))
    assert {step_of(s.label) for s in shown} == set(steps)  # no warm start, no earlier step
    per_step = stage_seconds(spans)
    assert sorted(per_step) == list(range(30))
    assert per_step[7] == pytest.approx({"rollout": 1.5, "reward": 1.4, "trainer": 0.9})  # (migrations are not stages)


def test_a_short_run_is_drawn_whole_and_a_long_one_with_its_strip(tmp_path):
    short, long = tmp_path / "short.png", tmp_path / "long.png"
    draw_timeline(run_spans(3), 2, str(short))
    draw_timeline(run_spans(200), 2, str(long))
    from matplotlib.image import imread
    assert imread(long).shape[0] > imread(short).shape[0]  # the strip adds a panel
    assert detail(run_spans(3))[1] == [0, 1, 2]


def test_the_reward_curve_is_a_panel_below(tmp_path):
    from dynarl.launch.timeline import rewards_of
    rows = [{"step": 0, "reward_mean": 0.25}, {"step": 1, "reward_mean": None}, {"step": 2, "reward_mean": 0.5}]
    assert rewards_of(rows) == [(0, 0.25), (2, 0.5)]  # (an embodied step before any episode ended: none)
    plain, curve = tmp_path / "plain.png", tmp_path / "curve.png"
    draw_timeline(run_spans(3), 2, str(plain))
    draw_timeline(run_spans(3), 2, str(curve), rewards=rewards_of(rows))
    from matplotlib.image import imread
    assert imread(curve).shape[0] > imread(plain).shape[0]
