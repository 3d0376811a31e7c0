"""The training progress display: a rich live panel on a terminal, plain lines otherwise.

Both show the same facts: step, current stage, reward, response lengths, tokens/s.
A step line starts `step I (K/N)`: I the step's index from 0, as metrics.jsonl's
"step" and ledger.jsonl name it, K = I + 1 of the run's N steps. A figure the step
did not compute (kl without a KL term: null in metrics.jsonl) is left out.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from dynarl.launch.step_moves import moves_text


def make_progress(total_steps: int, stream: TextIO | None = None) -> "PlainProgress | RichProgress":
    stream = stream or sys.stdout
    if stream.isatty():
        return RichProgress(total_steps, stream)
    return PlainProgress(total_steps, stream)


def step_line(m: dict[str, Any], total: int, eta_s: float | None = None) -> str:
    train = "".join(f"  {label} {m[key]:.{digits}f}" for key, label, digits in TRAIN_FIGURES
                    if m.get(key) is not None)
    eta = f"  eta {duration(eta_s)}" if eta_s is not None else ""
    eta = (f"  {moves}" if (moves := moves_text(m)) else "") + eta  # scheduler.policy=dynarl: its moves
    if "env_steps_per_s" in m:  # the embodied workflow
        success = f"  success {m['success_rate']:.2f}" if "success_rate" in m else ""
        ret = "-" if m["reward_mean"] is None else f"{m['reward_mean']:.2f}"
        return (f"{step_label(m['step'], total)}  return {ret}{success}  episodes {m['episodes']}  "
                f"{m['env_steps_per_s']:.0f} env steps/s  env idle {m['env_idle_frac']:.2f}  "
                f"vloss {m['value_loss']:.3f}  ev {m['explained_var'] or 0:.2f}  {m['step_time_s']:.2f} s "
                f"[rollout {m['rollout_s']:.2f} train {m['trainer_s']:.2f} sync {m['sync_s']:.2f}]{eta}")
    judge, judge_s = "", ""
    if "judge_s" in m:  # an LLM judge (judge.enabled): its mean score, how many judgments had none, its time
        judge = f"  judge {m['judge_score_mean'] or 0:.2f} ({m['judge_unparseable']} unparsed)"
        judge_s = f" judge {m['judge_s']:.2f}"
    return (f"{step_label(m['step'], total)}  reward {m['reward_mean']:.3f}  exact {m['exact_frac']:.2f}{judge}  "
            f"len {m['response_len_mean']:.1f}/{m['response_len_max']}{train}  {m['tokens_per_s']:.0f} tok/s  "
            f"{m['step_time_s']:.2f} s [rollout {m['rollout_s']:.2f} reward {m['reward_s']:.2f}{judge_s} "
            f"inference {m['inference_s']:.2f} train {m['trainer_s']:.2f} sync {m['sync_s']:.2f}]{eta}")


def step_label(step: int, total: int) -> str:
    """`step 0 (1/200)`: the index metrics.jsonl's "step" holds, and the count."""
    return f"step {step} ({step + 1}/{total})"


TRAIN_FIGURES = (("loss", "loss", 4), ("kl", "kl", 4), ("grad_norm", "gnorm", 3))
"""The train step's figures on the step line: (metrics key, label, decimals)."""


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Eta:
    """Time left in the run: the mean wall time per step since the first step this
    process saw (checkpoints and weight syncs included), times the steps left."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self._first: tuple[float, int] | None = None

    def update(self, m: dict[str, Any]) -> float | None:
        now, step = time.monotonic(), m["step"]
        if self._first is None:
            self._first = (now, step)
        first_at, first_step = self._first
        per_step = (now - first_at) / (step - first_step) if step > first_step else m["step_time_s"]
        left = self.total - (step + 1)
        return per_step * left if left > 0 else None


class PlainProgress:
    def __init__(self, total_steps: int, stream: TextIO) -> None:
        self.total = total_steps
        self.stream = stream
        self._last_warmup = -1.0
        self._stepped = False
        self._stage = ""
        self._eta = Eta(total_steps)

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stream.flush()

    def stage(self, name: str) -> None:
        # Until the steps begin, what is starting (spawn, profiling, warm start: tens of
        # seconds); after that, a line per stage change would drown the step lines.
        if not self._stepped and name != self._stage:
            print(f"starting: {name}", file=self.stream, flush=True)
        self._stage = name

    def warmup(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total:
            self._stepped = True  # the steps begin: their own lines say the rest
        if total and (done == total or now - self._last_warmup > 5):
            self._last_warmup = now
            print(f"warm start {done}/{total}", file=self.stream, flush=True)

    def step(self, metrics: dict[str, Any]) -> None:
        self._stepped = True
        print(step_line(metrics, self.total, self._eta.update(metrics)), file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


class RichProgress:
    def __init__(self, total_steps: int, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live
        self.total = total_steps
        self.console = Console(file=stream)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.current = "starting"
        self.last: dict[str, Any] | None = None
        self.warm = (0, 0)
        self.started = time.monotonic()
        self._eta = Eta(total_steps)
        self.eta_s: float | None = None

    def __enter__(self) -> "RichProgress":
        self.live.__enter__()
        self._render()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._render()
        self.live.__exit__(*exc)

    def stage(self, name: str) -> None:
        self.current = name
        self._render()

    def warmup(self, done: int, total: int) -> None:
        self.warm = (done, total)
        self.current = "warm start"
        self._render()

    def step(self, metrics: dict[str, Any]) -> None:
        self.last = metrics
        self.eta_s = self._eta.update(metrics)
        self.console.print(step_line(metrics, self.total, self.eta_s))
        self._render()

    def note(self, text: str) -> None:
        self.console.print(text)

    def _render(self) -> None:
        from rich.table import Table
        table = Table.grid(padding=(0, 2))
        m = self.last
        done = 0 if m is None else m["step"] + 1
        table.add_row("steps done", f"{done}/{self.total}", "stage", self.current,
                      "elapsed", duration(time.monotonic() - self.started),
                      *(("eta", duration(self.eta_s)) if self.eta_s is not None else ()))
        if self.warm[1]:
            table.add_row("warm start", f"{self.warm[0]}/{self.warm[1]}")
        if m is not None:
            table.add_row("reward", f"{m['reward_mean']:.3f}", "exact", f"{m['exact_frac']:.2f}",
                          "tokens/s", f"{m['tokens_per_s']:.0f}")
            table.add_row("length", f"{m['response_len_mean']:.1f} mean / {m['response_len_max']} max",
                          "step time", f"{m['step_time_s']:.2f} s")
            train = [(label, f"{m[key]:.{digits}f}") for key, label, digits in TRAIN_FIGURES
                     if m.get(key) is not None]
            if train:
                table.add_row(*(x for pair in train for x in pair))
        self.live.update(table)
