NUM_GPUS = 0
"""Plain (non-terminal) progress: what is starting is shown until the steps begin,
then one line per step."""

import io

from dynarl.launch.progress import PlainProgress

METRICS = dict(step=0, reward_mean=0.5, exact_frac=0.5, response_len_mean=4.0, response_len_max=8,
               tokens_per_s=100.0, step_time_s=1.0, rollout_s=0.2, reward_s=0.1, inference_s=0.1,
               trainer_s=0.5, sync_s=0.1)


def test_startup_stages_are_shown_then_only_the_steps():
    out = io.StringIO()
    progress = PlainProgress(2, out)
    for name in ("spawn", "trainer", "trainer"):
        progress.stage(name)
    progress.warmup(0, 3)
    progress.warmup(3, 3)
    progress.stage("rollout")  # the steps have begun: no more stage lines
    progress.step(METRICS)
    assert out.getvalue().splitlines()[:4] == ["starting: spawn", "starting: trainer", "warm start 0/3",
                                               "warm start 3/3"]
    assert len(out.getvalue().splitlines()) == 5 and out.getvalue().splitlines()[4].startswith("step 0 (1/2)  reward")


def test_no_warm_start_prints_no_warm_start_line():
    out = io.StringIO()
    progress = PlainProgress(1, out)
    progress.warmup(0, 0)
    assert out.getvalue() == ""


def test_the_step_line_has_the_train_figures_and_the_time_left():
    from dynarl.launch.progress import duration, step_line
    line = step_line(dict(METRICS, loss=0.0123, kl=0.0004, grad_norm=1.5), 10, eta_s=125.0)
    assert "loss 0.0123  kl 0.0004  gnorm 1.500" in line and line.endswith("eta 2m05s")
    assert "eta" not in step_line(METRICS, 1)  # the last step: nothing left
    # a step without a KL term: metrics.jsonl's kl is null, and the line says nothing of it
    assert "loss 0.0123  gnorm 1.500" in step_line(dict(METRICS, loss=0.0123, kl=None, grad_norm=1.5), 10)
    assert [duration(s) for s in (41.4, 190, 3725)] == ["41s", "3m10s", "1h02m"]


def test_eta_is_the_mean_step_time_so_far_times_the_steps_left(monkeypatch):
    from dynarl.launch import progress
    clock = iter([100.0, 104.0, 108.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    eta = progress.Eta(10)
    assert eta.update(dict(METRICS, step=2, step_time_s=3.0)) == 3.0 * 7  # first: its own step time
    assert eta.update(dict(METRICS, step=3)) == 4.0 * 6
    assert eta.update(dict(METRICS, step=9)) is None  # the run is done
