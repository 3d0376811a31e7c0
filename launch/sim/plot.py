"""`--plot DIR`: per policy, who owns how many devices over time (and how many compute),
like the paper's Fig 13; and one bar chart of the policies. matplotlib, Agg backend."""
from __future__ import annotations

import os
from typing import Any

from dynarl.components.placement.plan import COMPONENTS

COLORS = {"rollout": "#4c72b0", "inference": "#dd8452", "trainer": "#55a868"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_timeline(name: str, run, scn, directory: str) -> str:
    """timeline-<name>.png: devices held per component over time, and how many compute."""
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    times, stacks = ownership_steps(run.ownership)
    ax.stackplot(times, *[stacks[c] for c in COMPONENTS], labels=COMPONENTS, step="post",
                 colors=[COLORS[c] for c in COMPONENTS], alpha=0.55)
    bt, busy = busy_steps(run.busy)
    ax.step(bt, busy, where="post", color="black", linewidth=0.8, label="computing")
    for it in run.iterations:
        ax.axvline(it.end, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("devices")
    ax.set_ylim(0, scn.config.devices * 1.05)
    ax.set_title(f"{name}: {scn.config.workload} on {scn.config.devices} devices")
    ax.legend(loc="upper right", fontsize=8)
    path = os.path.join(directory, f"timeline-{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_policies(result: dict[str, Any], directory: str) -> str:
    """policies.png: iteration time per policy, its speedup over colocated, the bound."""
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    names = list(result["policies"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(names), 3.5))
    times = [result["policies"][n]["iter_time_s"] for n in names]
    ax.bar(names, times, color="#4c72b0")
    bound = max(result["policies"][n]["bound_s"] for n in names)
    ax.axhline(bound, color="black", linestyle="--", linewidth=1, label="lower bound")
    for i, n in enumerate(names):
        ax.text(i, times[i], f"{result['policies'][n]['speedup_vs_colocated']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("iteration time (s)")
    ax.set_title(f"{result['workload']}, {result['devices']} devices")
    ax.legend(fontsize=8)
    path = os.path.join(directory, "policies.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ownership_steps(spans: list[tuple[str, int, float, float]]) -> tuple[list[float], dict[str, list[int]]]:
    """Step functions: devices owned per component at each change point."""
    points = sorted({t for _, _, s, e in spans for t in (s, e)})
    stacks = {c: [0] * len(points) for c in COMPONENTS}
    index = {t: i for i, t in enumerate(points)}
    for c, n, s, e in spans:
        for i in range(index[s], index[e]):
            stacks[c][i] += n
    return points, stacks


def busy_steps(busy: list[tuple[float, float, int]]) -> tuple[list[float], list[int]]:
    """Devices computing at each change point (a sweep over interval ends)."""
    events: dict[float, int] = {}
    for s, e, n in busy:
        events[s] = events.get(s, 0) + n
        events[e] = events.get(e, 0) - n
    times, counts, level = [], [], 0
    for t in sorted(events):
        level += events[t]
        times.append(t)
        counts.append(level)
    return times, counts
