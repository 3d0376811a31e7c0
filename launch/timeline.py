"""timeline.png: devices x time, each bar coloured by the component holding the device.

Built from the workflow's spans (stages.StageClock): a locked stage holds its
group's devices for the span; CPU-only stages (reward) go on a "cpu" row. With
scheduler.policy=dynarl, "migrate <kind>" spans mark the devices a migration moved
(rollout -> trainer by workload + p2p inside the rollout's long tail, back by p2p
+ join, or grow without parked engines): a released engine's rollout bar stops
at its move, the migration bars follow on its device while the kept engines
still decode, and the trainer's bars then appear on devices that rollout held
when the step began.
"""
from __future__ import annotations

from typing import Sequence

from dynarl.components.workflows.stages import Span

COLOURS = {"rollout": "#4C72B0", "inference": "#DD8452", "trainer": "#55A868", "reward": "#C44E52",
           "sync": "#8172B3",
           # scheduler.policy=dynarl: devices changing hands inside a step (components/workflows/dynamic.py)
           "migrate workload": "#CCB974", "migrate p2p": "#64B5CD", "migrate grow": "#8C8C8C",
           "migrate join": "#8C8C8C"}


def draw_timeline(spans: Sequence[Span], num_devices: int, path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not spans:
        return
    # From the first GRPO step on when there is one: the warm start is tens of seconds
    # of trainer bars that would squeeze every step (and its moves) into a sliver.
    steps = [s.start for s in spans if s.label.startswith("step ")]
    t0 = min(steps) if steps else min(s.start for s in spans)
    spans = [s for s in spans if s.end >= t0]
    rows = [f"device {d}" for d in range(num_devices)] + ["cpu"]
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(rows) + 1.5))
    for s in spans:
        colour = COLOURS.get(s.component, "#937860")
        for row in s.devices or [num_devices]:
            ax.broken_barh([(s.start - t0, max(s.end - s.start, 1e-3))], (row - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first step began" if steps else "seconds since the first span")
    used = sorted({s.component for s in spans})
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#937860"), label=c) for c in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(used), frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
