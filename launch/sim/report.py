"""The simulator's output: deterministic JSON (rounded floats, sorted keys) and a table."""
from __future__ import annotations

import json
from typing import Any

DIGITS = 4


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, DIGITS) + 0.0  # + 0.0: no "-0.0"
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(rounded(result), sort_keys=True, indent=2)


def table(result: dict[str, Any]) -> str:
    rate = {"math": "tokens_per_s", "embodied": "env_steps_per_s"}.get(result["kind"], "requests_per_s")
    batch = f"{result['envs']} envs" if result["kind"] == "embodied" else f"{result['prompts']} prompts/iteration"
    head = (f"{result['workload']} on {result['devices']} emulated {result['device']} devices, seed "
            f"{result['seed']}, {batch}, {result['measured_iterations']} measured iteration(s) (virtual time; "
            "the cost model is not calibrated on a GPU yet: docs/COSTMODEL.md; columns: dynarl sim --help)")
    cols = ["policy", "iter_time_s", rate, "gpu_idle", "bound_s", "ratio", "speedup", "dec_ms_p99", "placement"]
    rows = [cols]
    for name, m in result["policies"].items():
        dec = m["decision_ms_p99"]
        rows.append([name, f"{m['iter_time_s']:.1f}", f"{m[rate]:.1f}", f"{m['gpu_idle_frac']:.3f}",
                     f"{m['bound_s']:.1f}", f"{m['ratio_to_bound']:.2f}", f"{m['speedup_vs_colocated']:.2f}",
                     "-" if dec is None else f"{dec:.2f}", m["placement"]["segments"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for name, m in result["policies"].items():
        lines += [f"  {name}: {note}" for note in m["replans"]]
        fail = m.get("fail")
        if fail is not None:
            lines.append(f"  {name}: {fail['lost']} rank(s) lost at {', '.join(f'{t:.1f}' for t in fail['lost_at_s'])} s, "
                         f"{fail['replaced']} replaced in place: +{fail['cost_s']:.1f} s over the run "
                         f"(same samples: {'yes' if fail['same_samples'] else 'NO'})")
    return "\n".join(lines)
