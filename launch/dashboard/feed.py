"""The dashboard's views of a run: pure functions of what the run directory holds
(metrics.jsonl rows, spans.jsonl spans, samples_text.jsonl lines, config.yaml), each
the JSON one endpoint of the page serves (server.py).

    summary     the run: workflow, scheduler, steps done of how many, devices, running?
    curves      per-step charts: reward, loss, KL, staleness, throughput, step time,
                devices held and moved, each stage's seconds
    migrations  the scheduler's moves per step, and each committed plan's predicted and
                measured time and gain
    step_view   one step's spans by device and component (who held which device when),
                its moves and its device counts over time
    samples     the logged samples (run.log_samples), filtered by step and reward

Times in a step's view are seconds since the step's first span began. A plan's gain is
its `current_s` (the time the step had left, predicted, had nothing moved) minus the
time it predicted with its moves (`predicted_s`: the predicted gain) or the time the
step then took to its end (`measured_s`: the measured gain; the unmoved time is never
observed, so both gains are against the same prediction).
"""
from __future__ import annotations

from typing import Any, Sequence

from dynarl.components.workflows.stages import Span
from dynarl.launch.step_moves import moves_of
from dynarl.launch.timeline import COLOURS, STRIP, stage_seconds, step_of

CHARTS = (
    ("reward", "reward", (("reward_mean", "mean"), ("exact_frac", "exact"), ("success_rate", "success"))),
    ("loss", "loss", (("loss", "loss"), ("value_loss", "value loss"))),
    ("kl", "KL", (("kl", "kl"),)),
    ("staleness", "staleness (weight versions)", (("staleness_mean", "mean"), ("staleness_max", "max"))),
    ("throughput", "throughput", (("tokens_per_s", "tokens/s"), ("env_steps_per_s", "env steps/s"))),
    ("step_time", "step time (s)", (("step_time_s", "step"),)),
)
"""(chart id, title, ((metrics key, label), ...)): a series whose key no step has is left out."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summary(rows: Sequence[dict[str, Any]], config: dict[str, Any], run_dir: str, running: bool) -> dict[str, Any]:
    run = config.get("run") or {}
    cluster = (config.get("runtime") or {}).get("cluster") or {}
    return {"run_dir": run_dir, "running": running, "workflow": config.get("workflow"),
            "scheduler": (config.get("scheduler") or {}).get("policy"), "steps_total": run.get("steps"),
            "steps_done": len(rows), "last_step": rows[-1]["step"] if rows else None,
            "last_time": rows[-1].get("time") if rows else None,
            "num_devices": num_devices(config), "device_kind": cluster.get("device_kind"),
            "log_samples": run.get("log_samples", 0), "colours": COLOURS}


def num_devices(config: dict[str, Any]) -> int | None:
    cluster = (config.get("runtime") or {}).get("cluster") or {}
    nodes, per_node = cluster.get("num_nodes"), cluster.get("devices_per_node")
    return nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None


def curves(rows: Sequence[dict[str, Any]], spans: Sequence[Span]) -> list[dict[str, Any]]:
    """The per-step charts: {"id", "title", "x": steps, "series": [{"key", "label",
    "values"}]} (a value None where a step has none). Steps count from 1, as the
    console's step lines do (metrics.jsonl's `step` + 1)."""
    steps = [r["step"] + 1 for r in rows]
    charts = []
    for ident, title, keys in CHARTS:
        series = [{"key": key, "label": label, "values": [_number(r.get(key)) for r in rows]}
                  for key, label in keys if any(key in r for r in rows)]
        if series:
            charts.append({"id": ident, "title": title, "x": steps, "series": series})
    components = sorted({c for r in rows for c in (r.get("devices") or {})})
    if components:
        devices = [{"key": f"devices.{c}.mean", "label": f"{c} mean",
                    "values": [_number(((r.get("devices") or {}).get(c) or {}).get("mean")) for r in rows]}
                   for c in components]
        devices.append({"key": "devices.trainer.max", "label": "trainer max",
                        "values": [_number(((r.get("devices") or {}).get("trainer") or {}).get("max")) for r in rows]})
        charts.append({"id": "devices", "title": "devices held per step", "x": steps, "series": devices})
    if any("plans" in r for r in rows):
        charts.append({"id": "moves", "title": "devices moved per step", "x": steps, "series": [
            {"key": "moves", "label": "moved", "values": [float(sum(moves_of(r).values())) for r in rows]}]})
    per_step = stage_seconds(spans)
    if per_step:
        x = list(per_step)
        charts.append({"id": "stages", "title": "stage seconds per step", "x": [n + 1 for n in x], "series": [
            {"key": f"{c}_wall_s", "label": c, "values": [per_step[n].get(c) for n in x]}
            for c in STRIP if any(c in per_step[n] for n in x)]})
    return charts


def migrations(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each dynarl step's moves (by kind:component, their seconds, devices by donor->receiver)
    and every committed plan, with its predicted and measured gain."""
    steps, plans = [], []
    for r in rows:
        if "plans" not in r:
            continue
        steps.append({"step": r["step"], "counts": r.get("migrations") or {}, "seconds": r.get("migration_s") or {},
                      "moves": moves_of(r), "in_tail": r.get("migrations_in_tail", 0),
                      "decisions": r.get("decisions", 0)})
        for p in r["plans"]:
            current, predicted, measured = (_number(p.get(k)) for k in ("current_s", "predicted_s", "measured_s"))
            plans.append({
                "step": r["step"], "at_vs_rollout_end_s": _number(p.get("at_vs_rollout_end_s")),
                "moves": ", ".join(f"{d}->{t} {n}" for d, t, n in p.get("moves") or []),
                "current_s": current, "predicted_s": predicted, "measured_s": measured,
                "migration_cost_s": _number(p.get("migration_cost_s")),
                "predicted_gain_s": None if current is None or predicted is None else current - predicted,
                "measured_gain_s": None if current is None or measured is None else current - measured})
    return {"steps": steps, "plans": plans}


def span_steps(spans: Sequence[Span]) -> list[int]:
    """The steps with spans, in order."""
    return sorted({n for s in spans if (n := step_of(s.label)) is not None})


def step_view(rows: Sequence[dict[str, Any]], spans: Sequence[Span], step: int | None,
              devices: int | None) -> dict[str, Any] | None:
    """Step `step`'s (None: the last with spans) spans, moves and device counts, times
    since its first span began; None when it has no spans (yet)."""
    steps = span_steps(spans)
    if step is None:
        step = steps[-1] if steps else None
    mine = [s for s in spans if step is not None and step_of(s.label) == step]
    if not mine:
        return None
    t0, t1 = min(s.start for s in mine), max(s.end for s in mine)
    row = next((r for r in rows if r.get("step") == step), {})
    rollout_end = _rollout_end(row, mine, step)
    moves = [{"at": p["at_s"] - t0, "text": ", ".join(f"{d}->{t} {n}" for d, t, n in p.get("moves") or []),
              "predicted_s": p.get("predicted_s"), "current_s": p.get("current_s"), "measured_s": p.get("measured_s")}
             for p in row.get("plans") or [] if _number(p.get("at_s")) is not None]
    counts = [{"at": at + rollout_end - t0, "counts": c} for at, c in row.get("device_counts_vs_rollout_end_s") or []] \
        if rollout_end is not None else []
    before = [r for r in rows if r.get("step") == step - 1 and r.get("device_counts_vs_rollout_end_s")]
    if counts and before:  # what the step began with: the counts the step before ended with
        counts.insert(0, {"at": 0.0, "counts": before[-1]["device_counts_vs_rollout_end_s"][-1][1]})
    used = [d for s in mine for d in s.devices]
    return {"step": step, "steps": steps, "duration_s": t1 - t0,
            "devices": max([devices or 0, *(d + 1 for d in used)]),
            "spans": [{"component": s.component, "devices": list(s.devices), "start": s.start - t0,
                       "end": s.end - t0, "label": s.label} for s in sorted(mine, key=lambda s: s.start)],
            "moves": moves, "counts": counts}


def _rollout_end(row: dict[str, Any], spans: Sequence[Span], step: int) -> float | None:
    """The loop time the step's rollout ended: what its plans were timed against, else its
    rollout span's end."""
    for p in row.get("plans") or []:
        at, rel = _number(p.get("at_s")), _number(p.get("at_vs_rollout_end_s"))
        if at is not None and rel is not None:
            return at - rel
    ends = [s.end for s in spans if s.component == "rollout" and s.label == f"step {step}"]
    return max(ends) if ends else None


LIST_FIELDS = ("id", "group", "problem", "answer", "prompt", "response", "reward", "advantage", "finish", "version")
"""A sample's fields in the samples list (its tokens, log-probs and turns: sample())."""


def samples(records: Sequence[dict[str, Any]], step: int | None = None, min_reward: float | None = None,
            max_reward: float | None = None, limit: int = 200) -> dict[str, Any]:
    """The logged samples of `step` (None: every step, the newest first) whose reward is
    within [min_reward, max_reward]: at most `limit`, and how many matched."""
    chosen = []
    for record in sorted(_last_per_step(records), key=lambda r: -r["step"]):
        if step is not None and record["step"] != step:
            continue
        for s in record["samples"]:
            reward = s.get("reward")
            if min_reward is not None and (reward is None or reward < min_reward):
                continue
            if max_reward is not None and (reward is None or reward > max_reward):
                continue
            chosen.append({"step": record["step"], **{k: s.get(k) for k in LIST_FIELDS},
                           "turns": len(s["turns"]) if s.get("turns") else 0})
    return {"steps": sorted(r["step"] for r in _last_per_step(records)), "total": len(chosen),
            "samples": chosen[:limit]}


def sample(records: Sequence[dict[str, Any]], step: int, ident: str) -> dict[str, Any] | None:
    """One logged sample whole (tokens, log-probs, turns), or None."""
    for record in _last_per_step(records):
        if record["step"] == step:
            for s in record["samples"]:
                if s.get("id") == ident:
                    return {"step": step, **s}
    return None


def _last_per_step(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step logged twice (trained again after a restart): its last line."""
    return list({int(r["step"]): r for r in records}.values())
