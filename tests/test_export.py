"""`dynarl export`: a run's checkpoint as an HF folder that transformers loads, with
the logits of dynarl's own model of those weights; `dynarl eval` of the run and of the
export, which score the same."""
NUM_GPUS = 0

import json
import subprocess
import sys

import pytest
import torch

from dynarl.components.trainer.native import checkpoint
from dynarl.launch.export import master_weights


def dynarl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-step run of the built-in task with a checkpoint after every step (2 DP ranks)."""
    folder = tmp_path_factory.mktemp("export")
    done = dynarl("train", "trainer.num_ranks=2", "run.steps=3", "run.checkpoint_every=1", "run.keep_checkpoints=5",
                  "run.prompts_per_step=4", "trainer.warmup.steps=2", "--run-dir", str(folder / "run"), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_the_export_loads_in_transformers_with_dynarl_s_logits(run):
    from transformers import AutoModelForCausalLM
    from dynarl.components.model.io import load_pretrained
    out = run / "hf"
    done = dynarl("export", str(run / "run"), str(out), cwd=run)
    assert done.returncode == 0, done.stderr
    assert "exported step 3" in done.stdout
    ckpt = run / "run" / "checkpoints" / "step_000003"
    theirs = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    ours = load_pretrained(out).eval()
    # the weights are the checkpoint's fp32 weights, joined from both ranks' shards
    assert checkpoint.load_meta(str(ckpt))["world_size"] == 2
    params = dict(theirs.named_parameters())
    for name, master in master_weights(str(ckpt)):
        assert torch.equal(params[name].detach(), master), name
    ids = torch.randint(3, ours.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(ids)
        got = theirs(input_ids=ids).logits
    assert expected.abs().max() > 0.01  # not a degenerate model
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ours.config.eos_token_id


def test_export_of_an_older_step_and_bad_input(run):
    done = dynarl("export", str(run / "run"), str(run / "hf1"), "--step", "1", cwd=run)
    assert done.returncode == 0 and "exported step 1" in done.stdout, done.stderr
    missing = dynarl("export", str(run / "run"), str(run / "hf9"), "--step", "9", cwd=run)
    assert missing.returncode == 2 and "no checkpoint of step 9" in missing.stderr and "Traceback" not in missing.stderr
    assert "there are: 0, 1, 2, 3" in missing.stderr  # step 0: after the warm start
    not_run = dynarl("export", str(run), str(run / "hf2"), cwd=run)
    assert not_run.returncode == 2 and "not a run directory" in not_run.stderr
    taken = dynarl("export", str(run / "run"), str(run / "hf1"), cwd=run)
    assert taken.returncode == 2 and "not empty" in taken.stderr


@pytest.mark.parametrize("n, c, k, expected", [(4, 0, 1, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0),
                                               (4, 2, 2, 1 - 1 / 6), (10, 3, 5, 1 - 21 / 252)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    from dynarl.launch.eval import pass_at_k
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_eval_of_a_run_and_of_its_export_agree(run):
    """The same policy evaluated from the run's checkpoint and from the exported folder
    (same task and sampling: the run's, given as overrides) scores the same."""
    common = ["--samples", "4", "--limit", "16", "--json"]
    from_run = dynarl("eval", str(run / "run"), *common, cwd=run)
    assert from_run.returncode == 0, from_run.stderr
    assert "eval 16/16 problems" in from_run.stderr
    result = json.loads(from_run.stdout)
    assert (result["problems"], result["samples"]) == (16, 4)
    assert 0.0 <= result["pass@1"] <= result["pass@4"] <= 1.0
    assert result["reward_mean"] > 0  # the built-in task gives partial credit
    hf = run / "hf_eval"
    assert dynarl("export", str(run / "run"), str(hf), cwd=run).returncode == 0
    from_hf = dynarl("eval", str(hf), *common, cwd=run)  # the run's task and sampling are the defaults
    assert from_hf.returncode == 0, from_hf.stderr
    assert {k: v for k, v in json.loads(from_hf.stdout).items() if k not in ("policy", "seconds")} == \
        {k: v for k, v in result.items() if k not in ("policy", "seconds")}


def test_eval_refuses_what_it_cannot_read(run):
    bad = dynarl("eval", str(run), cwd=run)
    assert bad.returncode == 2 and "neither a run directory" in bad.stderr and "Traceback" not in bad.stderr


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA run (model.lora.rank=4): the warm start trains the whole model, then two
    steps train the adapters on it."""
    folder = tmp_path_factory.mktemp("export_lora")
    done = dynarl("train", "model.lora.rank=4", "run.steps=2", "run.prompts_per_step=4", "trainer.warmup.steps=2",
                  "trainer.engine.lr=0.01", "--run-dir", str(folder / "run"), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_a_lora_run_exports_an_adapter_peft_loads_with_the_run_s_logits(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from dynarl.components.model.io import load_weights
    from dynarl.components.model.spec import build_policy_model
    from dynarl.launch.train import resolve_config
    out = lora_run / "hf"
    done = dynarl("export", str(lora_run / "run"), str(out), cwd=lora_run)
    assert done.returncode == 0, done.stderr
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(lora_run / "run" / "lora_base")
    # the run's own policy: its model with the checkpoint's weights, adapters and all
    cfg = resolve_config(None, [], str(lora_run / "run"))
    ours = build_policy_model(cfg.model).eval()
    load_weights(ours, master_weights(str(lora_run / "run" / "checkpoints" / "step_000002")), strict=True)
    trained = {n: t for n, t in ours.named_parameters() if n.endswith("lora_B")}
    assert any(t.abs().max() > 0 for t in trained.values())  # the adapters trained (B starts at zero)
    base = AutoModelForCausalLM.from_pretrained(adapter["base_model_name_or_path"], torch_dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    ids = torch.randint(3, cfg.model.config().vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(ids)
        torch.testing.assert_close(peft(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
