"""`dynarl bench faults`' accounting: what a faulty run is charged against the
fault-free one (the runs themselves are the bench's, minutes long)."""
import pytest

from dynarl.components.workflows.ledger import StepEntry
from dynarl.launch.bench import faults

STEPS = faults.STEPS


def run(ids_per_step, rewards=None, rc=0, recovery=(1.0, 3.0), digests=None):
    rows = [{"step": s, "reward_mean": (rewards or [0.5] * len(ids_per_step))[s]} for s in range(len(ids_per_step))]
    entries = [StepEntry(s, tuple(ids), tuple(digests[s] if digests else [0] * len(ids)))
               for s, ids in enumerate(ids_per_step)]
    return {"rc": rc, "wall_s": 1.0, "injected": 2, "recovery_s": list(recovery), "rows": rows, "entries": entries}


CLEAN = run([[f"{s}-{k}" for k in range(2)] for s in range(STEPS)])


@pytest.mark.parametrize("faulty, expected", [
    (CLEAN, dict(survived=True, samples_lost=0, samples_duplicated=0, same_tokens=True, reward_delta=0.0)),
    (run([[f"{s}-{k}" for k in range(2)] for s in range(STEPS - 1)]),  # a step short
     dict(survived=False, samples_lost=2)),
    (run([[f"{s}-0"] for s in range(STEPS)]), dict(survived=True, samples_lost=STEPS)),
    (run([[f"{s}-{k}" for k in range(2)] + ([f"{s}-0"] if s == 3 else []) for s in range(STEPS)]),
     dict(samples_duplicated=1, samples_lost=0)),
    (run([[f"{s}-{k}" for k in range(2)] for s in range(STEPS)], rc=1), dict(survived=False)),
    (run([[f"{s}-{k}" for k in range(2)] for s in range(STEPS)], rewards=[0.5] * (STEPS - 2) + [0.7, 0.9]),
     dict(reward_delta=pytest.approx(0.3))),
    (run([[f"{s}-{k}" for k in range(2)] for s in range(STEPS)], digests=[[s, s] for s in range(STEPS)]),
     dict(same_tokens=False)),
])
def test_a_faulty_run_is_charged_against_the_fault_free_one(faulty, expected):
    report = faults.compare("kill-trainer", faulty, CLEAN)
    assert report["recovery_s_p50"] == 2.0 and report["recovery_s_max"] == 3.0
    for key, value in expected.items():
        assert report[key] == value, (key, report)


@pytest.mark.parametrize("clean", [run([], rc=1), run([[f"{s}-0"] for s in range(STEPS - 1)])],
                         ids=["failed", "a-step-short"])
def test_no_figure_is_charged_against_a_fault_free_run_that_did_not_finish(clean):
    """A fault-free run that failed (a loaded machine missing a heartbeat at start)
    leaves nothing to compare: no vacuous "0 lost", and the bench fails."""
    report = faults.compare("kill-moving", CLEAN, clean)
    assert report["baseline_failed"] and report["survived"]
    assert report["samples_lost"] is report["samples_duplicated"] is report["same_tokens"] is None


def test_unknown_kinds_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        faults.main(["--kinds", "kill-everything"])
    assert info.value.code == 2 and "unknown kinds ['kill-everything']" in capsys.readouterr().err
