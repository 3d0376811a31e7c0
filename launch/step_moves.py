"""A step's scheduler moves (scheduler.policy=dynarl), as its metrics.jsonl row has them:
the plans the scheduler committed, each a list of (donor, receiver, devices). The console
step line and the dashboard say them the same way."""
from __future__ import annotations

from typing import Any


def moves_of(row: dict[str, Any]) -> dict[str, int]:
    """Devices moved in the step, by "donor->receiver", in the order first moved; empty
    where the step has no plans (policy static, or no move)."""
    out: dict[str, int] = {}
    for plan in row.get("plans") or []:
        for donor, receiver, devices in plan.get("moves") or []:
            key = f"{donor}->{receiver}"
            out[key] = out.get(key, 0) + int(devices)
    return out


def moves_text(row: dict[str, Any]) -> str:
    """"moves 3 (rollout->trainer 3)  trainer 1-4 dev" for a dynarl step (the receivers'
    device range over the step: devices.COMPONENT min-max); "moves 0" where it moved
    nothing; "" where the step has no scheduler figures (policy static)."""
    if "plans" not in row:
        return ""
    moves = moves_of(row)
    if not moves:
        return "moves 0"
    pairs = ", ".join(f"{pair} {n}" for pair, n in moves.items())
    text = f"moves {sum(moves.values())} ({pairs})"
    devices = row.get("devices") or {}
    for receiver in dict.fromkeys(pair.split("->")[1] for pair in moves):
        held = devices.get(receiver)
        if held:
            text += f"  {receiver} {held['min']:.0f}-{held['max']:.0f} dev"
    return text
