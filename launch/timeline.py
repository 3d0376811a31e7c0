"""timeline.png: devices x time, each bar coloured by the component holding the device.

Built from the workflow's spans (stages.StageClock): a locked stage holds its
group's devices for the span; CPU-only stages (reward) go on a "cpu" row. With
scheduler.policy=dynarl, "migrate <kind>" spans mark the devices a migration moved
(rollout -> trainer by workload + p2p inside the rollout's long tail, back by p2p
+ join, or grow without parked engines): a released engine's rollout bar stops
at its move, the migration bars follow on its device while the kept engines
still decode, and the trainer's bars then appear on devices that rollout held
when the step began. A run of more than DETAIL_STEPS steps shows its last ones so,
and every step's stage times in a strip below (a 200-step run drawn bar by bar was
a barcode). Given the steps' rewards (metrics.jsonl's reward_mean), a last panel
draws them per step.
"""
from __future__ import annotations

from typing import Any, Sequence

from dynarl.components.workflows.stages import Span

COLOURS = {"rollout": "#4C72B0", "inference": "#DD8452", "trainer": "#55A868", "reward": "#C44E52",
           "sync": "#8172B3", "critic": "#2E8B57", "env": "#DA8BC3", "judge": "#8C564B",
           # scheduler.policy=dynarl: devices changing hands inside a step (components/workflows/dynamic.py)
           "migrate workload": "#CCB974", "migrate p2p": "#64B5CD", "migrate switch": "#B5A642",
           "migrate grow": "#8C8C8C", "migrate join": "#8C8C8C"}


DETAIL_STEPS = 10
"""Steps drawn device by device; a longer run also gets a strip of every step's stage times."""
STRIP = ("rollout", "reward", "judge", "inference", "trainer", "sync")


def step_of(label: str) -> int | None:
    """12 for "step 12" (and "step 12 released"), None for warm start, checkpoints, ..."""
    if not label.startswith("step "):
        return None
    word = label.split()[1]
    return int(word) if word.isdigit() else None


def detail(spans: Sequence[Span]) -> tuple[list[Span], list[int]]:
    """The spans of the last DETAIL_STEPS steps (from their first start on), and those
    steps; with no step yet, every span."""
    steps = sorted({n for s in spans if (n := step_of(s.label)) is not None})
    if not steps:
        return list(spans), []
    shown = steps[-DETAIL_STEPS:]
    t0 = min(s.start for s in spans if step_of(s.label) in shown)
    return [s for s in spans if s.end >= t0 and (step_of(s.label) is None or step_of(s.label) in shown)], shown


def stage_seconds(spans: Sequence[Span]) -> dict[int, dict[str, float]]:
    """Per step, the wall time of each component's stage: its last span's end minus its
    first span's start in that step."""
    bounds: dict[int, dict[str, list[float]]] = {}
    for s in spans:
        n = step_of(s.label)
        if n is None or s.component not in STRIP:
            continue
        b = bounds.setdefault(n, {}).setdefault(s.component, [s.start, s.end])
        b[0], b[1] = min(b[0], s.start), max(b[1], s.end)
    return {n: {c: e - b for c, (b, e) in per.items()} for n, per in sorted(bounds.items())}


def rewards_of(rows: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, reward_mean) of metrics.jsonl's `rows` that have one (an embodied step
    before any episode ended has none)."""
    return [(int(r["step"]), float(r["reward_mean"])) for r in rows if r.get("reward_mean") is not None]


def draw_timeline(spans: Sequence[Span], num_devices: int, path: str, title: str = "",
                  rewards: Sequence[tuple[int, float]] = ()) -> None:
    """Devices x time over the last DETAIL_STEPS steps; below it, for a longer run, each
    step's stage times as a stacked bar (the whole run at a glance); then, given
    `rewards` ((step, reward) pairs), the reward curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not spans:
        return
    # From the first shown step on: the warm start is tens of seconds of trainer bars
    # that would squeeze every step (and its moves) into a sliver.
    shown_spans, shown = detail(spans)
    per_step = stage_seconds(spans)
    strip = len(per_step) > DETAIL_STEPS
    t0 = min(s.start for s in shown_spans)
    rows = [f"device {d}" for d in range(num_devices)] + ["cpu"]
    height = 0.6 * len(rows) + 1.5
    ratios = [height] + ([3] if strip else []) + ([2.5] if rewards else [])
    fig, axes = plt.subplots(len(ratios), 1, figsize=(12, sum(ratios)), squeeze=False,
                             gridspec_kw={"height_ratios": ratios})
    ax = axes[0][0]
    for s in shown_spans:
        colour = COLOURS.get(s.component, "#937860")
        for row in s.devices or [num_devices]:
            ax.broken_barh([(s.start - t0, max(s.end - s.start, 1e-3))], (row - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    if shown:
        steps = f"step {shown[0] + 1}" if len(shown) == 1 else f"steps {shown[0] + 1}-{shown[-1] + 1}"
        ax.set_xlabel(f"seconds since {steps} began" + (f" (the last {len(shown)})" if strip else ""))
    else:
        ax.set_xlabel("seconds since the first span")
    used = sorted({s.component for s in shown_spans})
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#937860"), label=c) for c in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(used), frameon=False)
    ax.set_title(title)
    if strip:
        bottom = axes[1][0]
        xs = list(per_step)
        base = [0.0] * len(xs)
        for c in STRIP:
            values = [per_step[n].get(c, 0.0) for n in xs]
            bottom.bar([n + 1 for n in xs], values, bottom=base, width=1.0, color=COLOURS[c], label=c)
            base = [b + v for b, v in zip(base, values)]
        bottom.set_xlabel("step")
        bottom.set_ylabel("stage seconds")
        bottom.set_xlim(0.5, xs[-1] + 1.5)
    if rewards:
        curve = axes[-1][0]
        curve.plot([n + 1 for n, _ in rewards], [r for _, r in rewards], color=COLOURS["reward"],
                   marker="o" if len(rewards) <= 50 else None, markersize=3)
        curve.set_xlabel("step")
        curve.set_ylabel("reward (mean)")
        curve.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
