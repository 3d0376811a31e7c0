"""run.loggers: every step's metrics also in TensorBoard, W&B (offline) and MLflow
(a local file store), equal to metrics.jsonl's."""
import glob
import json
import os
import subprocess
import sys

import pytest

from dynarl.launch import trackers


def test_scalars_are_the_numbers_with_nested_dicts_flattened():
    metrics = {"step": 3, "reward_mean": 0.5, "verifier": "math", "ok": True,
               "migrations": {"workload:rollout": 2, "p2p:trainer": 1}, "plans": [{"x": 1}]}
    assert trackers.scalars(metrics) == {"step": 3.0, "reward_mean": 0.5, "migrations/workload:rollout": 2.0,
                                         "migrations/p2p:trainer": 1.0}


def test_a_tracker_that_is_not_installed_is_named_with_its_package(monkeypatch):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    assert trackers.missing_packages(["jsonl", "wandb"]) == ["logger 'wandb' needs the wandb package: pip install wandb"]


def train(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, WANDB_SILENT="true"))


def test_an_unknown_logger_is_a_config_error(tmp_path):
    done = train("run.loggers=[jsonl,neptune]", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2 and "run.loggers" in done.stderr and "'neptune'" in done.stderr
    assert not (tmp_path / "run").exists()


def test_every_tracker_gets_the_steps_metrics(tmp_path):
    """On a GSM8K-format file (the preset), as a user coming from TRL would run it."""
    for module in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(module)
    run = tmp_path / "run"
    with open(tmp_path / "gsm8k.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) + "\n")
    done = train("task.kind=dataset", "task.dataset.preset=gsm8k", f"task.dataset.path={tmp_path / 'gsm8k.jsonl'}",
                 "run.steps=2", "run.prompts_per_step=4", "trainer.warmup.steps=2",
                 "run.loggers=[jsonl,tensorboard,wandb,mlflow]", "--run-dir", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rewards = [json.loads(line)["reward_mean"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("reward_mean")
    assert [e.step for e in scalars] == [0, 1]
    assert [e.value for e in scalars] == pytest.approx(rewards, rel=1e-6)  # (float32 in the event file)
    assert "loss" in events.Tags()["scalars"]
    # the scheduler's per-component device counts: constant under the static policy
    # (tests/test_dynarl_train.py checks them moving under dynarl)
    counts = {"devices/rollout/mean", "devices/trainer/mean", "devices/rollout/max", "devices/trainer/min"}
    assert counts <= set(events.Tags()["scalars"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in events.Scalars("devices/trainer/mean")] == [r["devices"]["trainer"]["mean"] for r in rows]
    assert all(r["devices"]["trainer"]["mean"] >= 1 for r in rows)

    offline = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(offline) == 1 and os.path.getsize(offline[0]) > 0

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{run / 'mlruns'}")
    (found,) = client.search_runs([client.get_experiment_by_name("dynarl").experiment_id])
    assert found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "reward_mean")
    assert [m.step for m in history] == [0, 1] and [m.value for m in history] == pytest.approx(rewards)
