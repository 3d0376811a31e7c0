NUM_GPUS = 0
"""On-policy distillation (algorithm.name opd): the per-token advantage against a
reference written from the formula, A_t = -(log pi_student - log pi_teacher); its loss's
gradient; the teacher's config (one clear line, rc 2, without one); the teacher's
log-probs along the samples into the batch; a two-step `dynarl train` with a teacher."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from dynarl import ConfigError
from dynarl.components.experience import PromptGroup, Sample, stream_batch, train_batch
from dynarl.components.model.io import save_pretrained
from dynarl.components.model.spec import ModelSpec, build_model
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.trainer import advantages as adv
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native import objectives
from dynarl.components.workflows.config import load_config
from grpo_tiny import overrides

OPD = ("algorithm.name=opd", "algorithm.teacher.name=tiny-1m")


def ref_opd(old, teacher, mask):
    """A_t = -(student_t - teacher_t) on mask-1 tokens, 0 elsewhere."""
    return [-(o - t) if m else 0.0 for o, t, m in zip(old, teacher, mask)]


@pytest.mark.parametrize("old, teacher, mask", [
    pytest.param([-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], [1, 1, 1], id="agree"),
    pytest.param([-3.0, -0.2, -1.0], [-0.5, -2.2, -1.5], [1, 1, 1], id="teacher-likes-it-or-not"),
    pytest.param([-3.0, -9.0, -1.0], [-0.5, -0.1, -1.5], [1, 0, 1], id="observation-token-gets-0"),
    pytest.param([], [], [], id="empty"),
])
def test_the_opd_advantage_is_the_negative_reverse_kl_per_token(old, teacher, mask):
    got = adv.opd_advantages([old], [teacher], [mask])
    assert got[0] == pytest.approx(ref_opd(old, teacher, mask))


def test_opd_advantages_refuse_other_tokens():
    with pytest.raises(ValueError, match="same tokens"):
        adv.opd_advantages([[-1.0, -2.0]], [[-1.0]], [[1, 1]])


def batch(**kw):
    fields = dict(input_ids=[[1, 5, 6, 7], [1, 8, 9]], prompt_lens=[1, 1], response_mask=[[1, 0, 1], [1, 1]],
                  old_logprobs=[[-1.0, -2.0, -3.0], [-0.5, -0.7]], teacher_logprobs=[[-0.4, -9.0, -3.5], [-2.0, -0.7]],
                  rewards=[1.0, 0.0], group_ids=[0, 0])
    return TrainBatch(**(fields | kw))


def test_a_step_takes_opds_advantages_from_the_teacher_not_the_rewards():
    config = TrainerConfig(objective="opd")
    want = [ref_opd(o, t, m) for o, t, m in zip([[-1.0, -2.0, -3.0], [-0.5, -0.7]],
                                                 [[-0.4, -9.0, -3.5], [-2.0, -0.7]], [[1, 0, 1], [1, 1]])]
    assert [pytest.approx(row) for row in want] == objectives.step_advantages(batch(), config)
    # a streaming part's advantages are the reward stage's (zeros for opd): the teacher's win
    part = batch(rewards=None, group_ids=None, advantages=[0.0, 0.0])
    assert [pytest.approx(row) for row in want] == objectives.step_advantages(part, config)
    assert adv.group_advantages_for(config, [1.0, 0.0, 1.0], [3, 3, 3]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="teacher_logprobs"):
        objectives.step_advantages(batch(teacher_logprobs=None), config)


def test_the_opd_loss_descends_the_reverse_kl():
    """At ratio 1 (one update per step), d pg / d logp_t = -A_t / N = (student_t - teacher_t) / N:
    the REINFORCE estimate of the gradient of KL(student || teacher), discount 0."""
    old, teacher, mask = [-1.0, -2.0, -0.3, -1.1], [-0.4, -2.5, -0.3, -3.0], [1, 1, 1, 0]
    a = ref_opd(old, teacher, mask)
    logp = torch.tensor(old, requires_grad=True)
    got = objectives.objective_loss("opd", logp, torch.tensor(old), torch.tensor(a),
                                    torch.tensor(mask, dtype=torch.float), clip_eps_low=0.2, clip_eps_high=0.2,
                                    num_tokens=3)
    got.pg_loss.backward()
    want = [(o - t) / 3 if m else 0.0 for o, t, m in zip(old, teacher, mask)]
    assert logp.grad.tolist() == pytest.approx(want)
    assert got.pg_loss.item() == pytest.approx(-sum(a) / 3)


# ---- the teacher's log-probs along the samples ------------------------------------------

def group(teacher=True):
    s = [Sample("a", 0, output_ids=[5, 6], logprobs=[-1.0, -1.0], reward=1.0, advantage=0.5,
                old_logprobs=[-1.1, -0.9], teacher_logprobs=[-0.5, -2.0] if teacher else None)]
    return PromptGroup(0, "p", "", [1, 2], s)


def test_the_batch_carries_the_samples_teacher_logprobs():
    assert train_batch([group()], with_ref=False).teacher_logprobs == [[-0.5, -2.0]]
    assert stream_batch([group()], with_ref=False).teacher_logprobs == [[-0.5, -2.0]]
    assert train_batch([group(teacher=False)], with_ref=False).teacher_logprobs is None


def test_a_group_written_before_teacher_logprobs_existed_still_loads():
    wire = group().to_json()
    wire[4] = [s[:-1] for s in wire[4]]  # a sample of one field fewer (an older checkpoint's)
    loaded = PromptGroup.from_json(wire)
    assert loaded.samples[0].teacher_logprobs is None and loaded.samples[0].old_logprobs == [-1.1, -0.9]
    assert PromptGroup.from_json(group().to_json()).samples[0].teacher_logprobs == [-0.5, -2.0]


# ---- the config ------------------------------------------------------------------------------

def test_opd_takes_a_teacher_of_the_policys_tokens(tmp_path):
    cfg = load_config(None, overrides(*OPD))
    assert cfg.trainer.engine.objective == "opd" and cfg.algorithm.teacher.name == "tiny-1m"
    folder = str(tmp_path / "exported")
    save_pretrained(build_model(ModelSpec()), folder)
    CharTokenizer().save(folder)  # what `dynarl export` writes for the built-in model
    assert load_config(None, overrides("algorithm.name=opd", f"algorithm.teacher.path={folder}")).algorithm.teacher


@pytest.mark.parametrize("extra, path, fragment", [
    pytest.param(("algorithm.name=opd",), "algorithm.teacher", "distils from a teacher", id="no-teacher"),
    pytest.param(("algorithm.teacher.name=tiny-1m",), "algorithm.teacher", "is for algorithm.name opd",
                 id="teacher-without-opd"),
    pytest.param((*OPD, "algorithm.teacher.lora.rank=4"), "algorithm.teacher.lora.rank", "frozen", id="lora"),
    pytest.param((*OPD, "trainer.backend=megatron"), "algorithm.name", "native trainer only", id="megatron"),
    pytest.param((*OPD, "workflow=ppo"), "algorithm.name", "GAE", id="ppo"),
])
def test_opd_config_errors_name_the_field(extra, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*extra))
    assert info.value.path == path
    assert fragment in str(info.value)


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path):
    folder = str(tmp_path / "hf")
    save_pretrained(build_model(ModelSpec()), folder)  # no tokenizer files: not the character tokenizer
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides("algorithm.name=opd", f"algorithm.teacher.path={folder}"))
    assert info.value.path == "algorithm.teacher" and "tokenizer" in str(info.value)


def test_opd_without_a_teacher_is_one_line_and_rc_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "algorithm.name=opd", "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "algorithm.teacher" in lines[0], lines
    assert not (tmp_path / "run").exists()


# ---- a run ------------------------------------------------------------------------------------

def test_a_run_distils_from_its_teacher(tmp_path):
    """Two opd steps with a built-in teacher: every step's row has the student's reverse KL
    to the teacher over its loss tokens, finite; the trainer trained on it."""
    from dynarl.launch.train import prepare

    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides(*OPD, "run.steps=2"), run_dir, None)
    assert job.run() == 0
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(rows) == 2
    for r in rows:
        t = r["teacher"]
        assert t["tokens"] > 0 and t["nonfinite"] == 0
        assert all(math.isfinite(t[k]) for k in ("kl", "kl_seq", "k3", "abs_mean")) and t["k3"] > 0
        assert math.isfinite(r["loss"]) and r["loss"] != 0.0
