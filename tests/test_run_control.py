import asyncio
from typing import get_args

import pytest

from dynarl.components.rollout.run_control import (IllegalTransition, Phase, RunControl, RunState, Transition,
                                                   next_state)

LEGAL = [  # (phase, transition, the phase it enters)
    ("running", "pause", "paused"), ("paused", "export", "exported"),
    ("running", "adopt", "running"), ("exported", "adopt", "paused"), ("handed_off", "adopt", "running"),
    ("running", "resume", "running"), ("paused", "resume", "running"), ("exported", "resume", "handed_off"),
    ("running", "hold", "running"), ("paused", "hold", "paused"), ("exported", "hold", "exported"),
    ("handed_off", "hold", "handed_off"),  # a rank a rolled-back move left empty, before its loop ends: the
    ("handed_off", "let_go", "handed_off"),  # next move may keep it (its drive loop waits while held)
    ("running", "let_go", "running"), ("paused", "let_go", "paused"), ("exported", "let_go", "exported"),
    ("running", "close", "closed"), ("paused", "close", "closed"), ("exported", "close", "closed"),
    ("handed_off", "close", "closed"), ("closed", "finish", "finished"),
]
ILLEGAL = [(p, t) for p in get_args(Phase) for t in get_args(Transition) if (p, t) not in {r[:2] for r in LEGAL}]


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("phase, transition, to", LEGAL)
def test_every_legal_transition_enters_its_phase_and_only_hold_and_let_go_change_held(phase, transition, to, held):
    assert next_state(RunState(phase, held), transition) == RunState(to, {"hold": True, "let_go": False}.get(
        transition, held))


@pytest.mark.parametrize("phase, transition", ILLEGAL)
def test_an_illegal_transition_is_refused_naming_the_phase_and_the_transition(phase, transition):
    with pytest.raises(IllegalTransition, match=f"a {phase} run cannot {transition}"):
        next_state(RunState(phase), transition)


async def test_a_pause_returns_at_the_drive_loops_boundary_and_a_resume_clears_it():
    class Engine:
        paused = False

        async def pause(self):
            self.paused = True

        async def resume(self):
            self.paused = False

    control, engine = RunControl(), Engine()
    pausing = asyncio.ensure_future(control.pause(engine))
    await control.arrived.wait()  # the drive loop is woken ...
    assert control.paused and engine.paused and not pausing.done()
    control.at_boundary.set()  # ... and reaches the boundary
    await pausing
    with pytest.raises(IllegalTransition, match="a paused run cannot pause"):
        await control.pause(engine)
    await control.resume(engine)
    assert not (control.paused or engine.paused or control.at_boundary.is_set())
