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
    assert len(out.getvalue().splitlines()) == 5 and out.getvalue().splitlines()[4].startswith("step 1/2")


def test_no_warm_start_prints_no_warm_start_line():
    out = io.StringIO()
    progress = PlainProgress(1, out)
    progress.warmup(0, 0)
    assert out.getvalue() == ""
