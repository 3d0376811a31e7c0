"""The memory plan as text: per device its peak and margin, then each phase's
components and parts, in GB (1e9 bytes)."""
from __future__ import annotations

from dynarl.components.memory.plan import DevicePlan, MemoryPlan


def gb(n: int) -> str:
    """GB with one decimal; small parts (under 0.1 GB) with three significant digits."""
    return f"{n / 1e9:.1f}" if abs(n) >= 10**8 else f"{n / 1e9:.3g}"


def format_plan(plan: MemoryPlan) -> str:
    kind = "gpu" if plan.device_kind == "cuda" else "cpu"
    lines = [f"memory plan: {gb(plan.device_bytes)} GB per {plan.device_kind} device, sequences of "
             f"{plan.seq_len} tokens (docs/memory.md)",
             f"{'device':<7} {'peak GB':>8} {'margin GB':>10}  phase of the peak"]
    for d in plan.devices:
        lines.append(f"{kind}{d.device:<4} {gb(d.peak):>8} {gb(plan.device_bytes - d.peak):>10}  {d.peak_phase}")
    for d in plan.devices:
        lines.append(f"{kind}{d.device}:")
        lines += [f"  {phase:<9} {gb(d.total(phase)):>6}  {_owners(d, phase)}" for phase in d.phases]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _owners(d: DevicePlan, phase: str) -> str:
    out = []
    for owner, parts in d.phases[phase].items():
        if parts:
            inner = ", ".join(f"{k} {gb(v)}" for k, v in parts.items())
            out.append(f"{owner} [{inner}]")
    return "; ".join(out)


def refusal(plan: MemoryPlan) -> str | None:
    """One message naming the first device over its memory, the component holding most
    there in that phase, and the numbers; None when every device fits."""
    over = plan.over_budget()
    if not over:
        return None
    d = over[0]
    phase = d.peak_phase
    owner, held = d.largest(phase)
    parts = ", ".join(f"{k} {gb(v)}" for k, v in d.phases[phase][owner].items())
    others = len(over) - 1
    return (f"device {d.device} ({plan.device_kind}) needs {gb(d.peak)} GB in its {phase} phase but has "
            f"{gb(plan.device_bytes)} GB: {owner} holds {gb(held)} GB ({parts})"
            + (f"; {others} more device(s) over" if others else "")
            + "; give the engines more devices (tensor parallel, more ranks), lower the micro-batch or the "
              "memory fractions, or set runtime.cluster.device_memory_gb to the real size")
