NUM_GPUS = 0
"""The supervised warm start runs by default on the built-in model (random weights) and
not on a model of your own (model.path) unless asked for (trainer.warmup.steps)."""

import pytest

from dynarl.components.workflows.config import load_config, to_dict
from dynarl.components.workflows.trainer_config import WarmupSection


@pytest.mark.parametrize("steps,model_path,resolved", [
    (None, None, 60), (None, "/models/qwen", 0), (0, None, 0), (20, "/models/qwen", 20), (5, None, 5),
])
def test_the_warm_start_default_depends_on_the_model(steps, model_path, resolved):
    assert WarmupSection(steps=steps).resolved_steps(model_path) == resolved


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from dynarl.components.model.io import save_pretrained
    from dynarl.components.model.spec import ModelSpec, build_model, build_tokenizer
    out = tmp_path_factory.mktemp("model")
    save_pretrained(build_model(ModelSpec()), out)
    build_tokenizer(ModelSpec()).save(out)
    return str(out)


@pytest.mark.parametrize("overrides,steps", [
    pytest.param([], 60, id="built-in"),
    pytest.param([("model.path", "FOLDER")], 0, id="own-model"),
    pytest.param([("model.path", "FOLDER"), ("trainer.warmup.steps", 60)], 60, id="own-model-asked"),
    pytest.param([("trainer.warmup.steps", 0)], 0, id="built-in-without"),
])
def test_the_loaded_config_and_its_lr_schedule(folder, overrides, steps):
    cfg = load_config(None, [(k, folder if v == "FOLDER" else v) for k, v in overrides])
    assert cfg.trainer.warmup.steps == steps and cfg.trainer.engine.lr_step_offset == steps
    again = load_config(to_dict(cfg))  # config.yaml, read back on --resume
    assert again.trainer.warmup.steps == steps
