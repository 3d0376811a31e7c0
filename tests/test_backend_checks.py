NUM_GPUS = 0
"""Config-load checks for the optional backends (components/extras.py, backends.py)
and the GPU example configs under examples/: their backend sections, model shapes and
placement resolve on a CPU machine without the extras."""
import dataclasses
import pathlib
import sys

import pytest
import yaml

from dynarl import ConfigError
from dynarl.components import extras
from dynarl.components.backends import check_backends
from dynarl.components.model.config import read_config
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.placement.plan import from_pools
from dynarl.core.config import ClusterConfig
from dynarl.core.config_tree import build
from dynarl.core.scheduler.policy import DynarlConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("grpo_*.yaml"))
QWEN_7B = read_config(ROOT / "examples" / "qwen2.5-7b")


def test_a_missing_extra_names_the_pip_command_and_the_field(monkeypatch):
    monkeypatch.setitem(extras.EXTRAS, "fancy", ("dynarl_no_such_package.core", "no-such"))
    assert not extras.is_available("fancy")
    with pytest.raises(ConfigError, match=r"pip install 'dynarl\[fancy\]'") as info:
        extras.require_extra("fancy", "trainer.backend")
    assert info.value.path == "trainer.backend"


def test_builtin_backends_need_nothing():
    for backend in ("native", "emulated"):
        extras.require_extra(backend, "rollout.backend")


def test_find_spec_does_not_import_the_backend():
    extras.is_available("sglang")
    extras.is_available("megatron")
    assert "sglang" not in sys.modules or not hasattr(sys.modules["sglang"], "Engine")


@pytest.mark.parametrize("version, release", [
    ("0.5.23", (0, 5, 23)), ("0.5.23.post1", (0, 5, 23)), ("0.32.0+cpu", (0, 32, 0)), ("0.17.0rc1", (0, 17, 0)),
    ("1.0.0.dev3", (1, 0, 0)), ("2", (2,)),
])
def test_a_release_is_read_from_the_version(version, release):
    assert extras.release(version) == release


@pytest.mark.parametrize("backend, version, ok", [
    ("sglang", "0.5.23", True), ("sglang", "0.5.24.post2", True), ("sglang", "0.5.22", False),
    ("sglang", "0.6.0", False), ("vllm", "0.32.0+cpu", True), ("vllm", "0.32.1", True), ("vllm", "0.11.0", False),
    ("vllm", "0.33.0rc1", False), ("megatron", "0.16.1", True), ("megatron", "0.17.0", False),
    ("native", "9.9", True),
])
def test_supported_releases(backend, version, ok):
    problem = extras.version_problem(backend, version)
    assert (problem is None) == ok
    if not ok:
        assert version in problem and ">=" in problem and f"dynarl[{backend}]" in problem


@pytest.mark.skipif(not extras.is_available("megatron"), reason="megatron-core not installed")
def test_an_installed_release_outside_the_range_fails_at_load_naming_the_field(monkeypatch):
    extras.require_extra("megatron", "trainer.backend")  # the one CI installs
    monkeypatch.setitem(extras.SUPPORTED, "megatron", ((0, 1), (0, 2)))
    with pytest.raises(ConfigError, match=r"supports >=0.1,<0.2") as info:
        extras.require_extra("megatron", "trainer.backend")
    assert info.value.path == "trainer.backend"


@pytest.mark.skipif(extras.is_available("sglang"), reason="sglang is installed")
def test_selecting_sglang_without_it_fails_at_load():
    with pytest.raises(ConfigError, match=r"pip install 'dynarl\[sglang\]'") as info:
        check_backends(rollout_backend="sglang", trainer_backend="native", model=QWEN_7B, rollout_ranks=1,
                       trainer_ranks=1)
    assert info.value.path == "rollout.backend"


@pytest.mark.parametrize("kwargs, path, fragment", [
    pytest.param(dict(trainer_backend="deepspeed"), "trainer.backend", "choose from", id="unknown-backend"),
    pytest.param(dict(megatron=MegatronConfig(tensor_parallel_size=8)), "trainer.megatron.tensor_parallel_size",
                 "num_key_value_heads=4", id="tp-over-kv-heads"),
    pytest.param(dict(trainer_ranks=6, megatron=MegatronConfig(tensor_parallel_size=4)), "trainer.num_ranks",
                 "multiple", id="ranks-not-multiple-of-tp"),
    pytest.param(dict(rollout_backend="sglang", sglang=SGLangConfig(tp_size=3)), "rollout.sglang.tp_size",
                 "num_attention_heads=28", id="sglang-tp"),
    pytest.param(dict(model=dataclasses.replace(QWEN_7B, model_type="llama", rope_llama3=(8.0, 1.0, 4.0, 256))),
                 "trainer.backend", "original_max_position_embeddings", id="llama3-rope-megatron-cannot-build"),
])
def test_layout_errors_name_the_field(kwargs, path, fragment):
    args = dict(rollout_backend="native", trainer_backend="megatron", model=QWEN_7B, rollout_ranks=4,
                trainer_ranks=8, require_installed=False)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=fragment) as info:
        check_backends(**args)
    assert info.value.path == path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_resolve_on_cpu(path):
    data = yaml.safe_load(path.read_text())
    model = read_config(ROOT / data["model"]["path"])
    assert model.num_parameters == pytest.approx(7.6e9, rel=0.01)  # Qwen2.5-7B's shapes
    rollout, trainer = data["rollout"], data["trainer"]
    sglang = build(SGLangConfig, rollout["sglang"], "rollout.sglang")
    megatron = build(MegatronConfig, trainer["megatron"], "trainer.megatron")
    notes = check_backends(rollout_backend=rollout["backend"], trainer_backend=trainer["backend"], model=model,
                           rollout_ranks=rollout["num_ranks"], trainer_ranks=trainer["num_ranks"],
                           sglang=sglang, megatron=megatron, require_installed=False)
    assert all("pip install 'dynarl[" in note for note in notes)
    assert ("sglang" in " ".join(notes)) == (not extras.is_available("sglang"))
    cluster = build(ClusterConfig, data["runtime"]["cluster"], "runtime.cluster")
    ranks = {c: data[c]["num_ranks"] for c in ("rollout", "inference", "trainer")}
    plan = from_pools(data["placement"]["mode"], cluster.num_devices, ranks, data["placement"].get("pools"))
    assert all(max(plan.rank_devices(c)) < cluster.num_devices for c in ranks)
    assert cluster.device_kind == "cuda"
    build(DynarlConfig, data["scheduler"].get("dynarl", {}), "scheduler.dynarl")


@pytest.mark.skipif(extras.is_available("vllm"), reason="vllm is installed")
def test_selecting_vllm_without_it_fails_at_load():
    with pytest.raises(ConfigError, match=r"pip install 'dynarl\[vllm\]'") as info:
        check_backends(rollout_backend="vllm", trainer_backend="native", model=QWEN_7B, rollout_ranks=1,
                       trainer_ranks=1)
    assert info.value.path == "rollout.backend"


@pytest.mark.skipif(extras.is_available("vllm"), reason="vllm is installed")
def test_dynarl_train_on_vllm_without_it_is_one_line_and_rc_2(tmp_path):
    import subprocess
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "rollout.backend=vllm", "run.steps=1",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "rollout.backend" in lines[0] and "dynarl[vllm]" in lines[0], done.stderr


def test_vllm_tp_must_divide_the_heads():
    from dynarl.components.rollout.vllm.config import VLLMConfig
    with pytest.raises(ConfigError, match="num_attention_heads=28") as info:
        check_backends(rollout_backend="vllm", trainer_backend="native", model=QWEN_7B, rollout_ranks=1,
                       trainer_ranks=1, vllm=VLLMConfig(tp_size=3), require_installed=False)
    assert info.value.path == "rollout.vllm.tp_size"


def _folder(tmp_path, name, model="tiny-1m", weights=True, edit=None):
    from dynarl.components.model.io import save_pretrained
    from dynarl.components.model.spec import ModelSpec, build_model
    folder = tmp_path / name
    save_pretrained(build_model(ModelSpec(name=model)), folder)
    if not weights:
        for f in folder.glob("*.safetensors"):
            f.unlink()
    if edit:
        import json
        config = json.loads((folder / "config.json").read_text())
        config.update(edit)
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("make, fragment", [
    (lambda tmp: _folder(tmp, "ok"), None),
    (lambda tmp: str(tmp / "missing"), "is not a folder"),
    (lambda tmp: (tmp / "empty").mkdir() or str(tmp / "empty"), "no config.json"),
    (lambda tmp: _folder(tmp, "gpt2", edit={"model_type": "gpt2"}), "model_type 'gpt2' is not supported"),
    (lambda tmp: _folder(tmp, "noweights", weights=False), "no *.safetensors"),
    (lambda tmp: _folder(tmp, "other", model="tiny-4m"), "hidden_size"),
], ids=["ok", "missing", "no-config", "architecture", "no-weights", "other-shape"])
def test_an_engine_model_the_engine_cannot_serve_is_named(tmp_path, make, fragment):
    from dynarl.components.backends import served_model_problem
    from dynarl.components.model.config import TINY_CONFIGS
    problem = served_model_problem(make(tmp_path), TINY_CONFIGS["tiny-1m"])
    assert problem is None if fragment is None else fragment in problem, problem


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_an_engine_model_path_is_checked_at_load(tmp_path, backend):
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.rollout.vllm.config import VLLMConfig
    engine = {f"{backend}": (SGLangConfig if backend == "sglang" else VLLMConfig)(model_path=str(tmp_path / "no"))}
    with pytest.raises(ConfigError, match="is not a folder") as info:
        check_backends(rollout_backend=backend, trainer_backend="native", model=TINY_CONFIGS["tiny-1m"],
                       rollout_ranks=1, trainer_ranks=1, require_installed=False, **engine)
    assert info.value.path == f"rollout.{backend}.model_path"
