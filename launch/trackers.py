"""Experiment trackers for `dynarl train` (`run.loggers`): every step's metrics, as
metrics.jsonl has them, also go to TensorBoard, W&B or MLflow.

    jsonl        metrics.jsonl: the run's own record, always written (resume and the
                 summary read it); naming it changes nothing
    tensorboard  event files in RUN_DIR/tensorboard (torch.utils.tensorboard)
    wandb        an offline W&B run in RUN_DIR/wandb (no network; `wandb sync` uploads it)
    mlflow       a local MLflow file store, RUN_DIR/mlruns

Scalars are every number in a step's metrics; nested dicts (the scheduler's
migrations per kind, seconds per kind, each component's device count over the
step: `devices/rollout/mean`, `/min`, `/max`) become `parent/child`. The tracker packages
are optional: one that is not installed is an error when the config loads.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Protocol

from dynarl.components.workflows.config import LOGGERS


def missing_packages(names: list[str]) -> list[str]:
    """Why each of the loggers `names` cannot run here: its package is not installed."""
    return [f"logger {name!r} needs the {LOGGERS[name]} package: pip install {LOGGERS[name]}"
            for name in names if LOGGERS[name] is not None and importlib.util.find_spec(LOGGERS[name]) is None]


def scalars(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number in `metrics` (bools and strings left out), nested dicts flattened."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= scalars(value, f"{name}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoard:
    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        import wandb
        self.run = wandb.init(project="dynarl", dir=run_dir, mode="offline", config=config,
                              name=os.path.basename(os.path.abspath(run_dir)), reinit="create_new")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        # MLflow 3 keeps its file store in maintenance mode and refuses it unless told; its
        # database stores need SQLAlchemy, which mlflow-skinny does not bring
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        import mlflow
        self.client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{os.path.join(os.path.abspath(run_dir), 'mlruns')}")
        experiment = self.client.get_experiment_by_name("dynarl")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("dynarl")
        self.run_id = self.client.create_run(experiment_id, run_name=os.path.basename(run_dir)).info.run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.client.log_metric(self.run_id, name.replace("/", "."), value, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS = {"tensorboard": TensorBoard, "wandb": Wandb, "mlflow": Mlflow}


class Tracked:
    """The run's progress display, with every step also sent to the trackers."""

    def __init__(self, progress: Any, trackers: list[Tracker]) -> None:
        self.progress = progress
        self.trackers = trackers

    def stage(self, name: str) -> None:
        self.progress.stage(name)

    def warmup(self, done: int, total: int) -> None:
        self.progress.warmup(done, total)

    def note(self, text: str) -> None:
        self.progress.note(text)

    def step(self, metrics: dict[str, Any]) -> None:
        values = scalars(metrics)
        for tracker in self.trackers:
            tracker.log(int(metrics["step"]), values)
        self.progress.step(metrics)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def tracked(progress: Any, names: list[str], run_dir: str, config: dict[str, Any]) -> Tracked:
    return Tracked(progress, [TRACKERS[name](run_dir, config) for name in names if name in TRACKERS])
