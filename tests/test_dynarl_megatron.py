NUM_GPUS = 0
"""scheduler.policy=dynarl with trainer.backend=megatron on a real `dynarl train` run
(CPU, 4 logical devices: rollout 0-2, inference and trainer time-sharing 3): in every
step idle rollout engines are released (Workload migration) and the megatron trainer
reshards peer-to-peer onto their devices (DP 1 -> 3, weights and Adam moments) and
back before the weight sync; the job trains exactly the samples scheduler.policy=static
trains. The trainer processes get tests/megatron_cpu.py's CUDA shims (megatron_cpu_site
on their path); tests/test_megatron_reshard.py covers TP changes."""
import os

import pytest

from dynarl.components.extras import is_available
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from grpo_tiny import overrides
from test_dynarl_train import FAST, JOB, _children, _rows

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

SITE = os.path.join(os.path.dirname(__file__), "megatron_cpu_site")
MEGATRON = ("trainer.backend=megatron", "trainer.warmup.steps=4",
            "trainer.megatron={optimizer: adamw, dtype: float32, use_distributed_optimizer: false, "
            "use_cpu_initialization: true}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNARL_TEST_MEGATRON_CPU", "1")
        mp.syspath_prepend(SITE)  # the local launcher hands the controller's path to its workers
        for policy in ("static", "dynarl"):
            before = _children()
            run_dir = str(tmp_path_factory.mktemp(policy))
            job = prepare(None, overrides(*JOB, *MEGATRON, f"scheduler.policy={policy}", *FAST), run_dir, None)
            assert job.run() == 0
            assert _children() <= before, "worker processes left behind"
            out[policy] = run_dir
    return out


def test_dynarl_reshards_the_megatron_trainer_in_every_step(runs):
    rows = _rows(runs["dynarl"])
    assert all(r["migrations"].get("workload:rollout", 0) >= 1 and r["migrations"].get("p2p:trainer", 0) >= 2
               for r in rows), rows  # out of rollout, into the trainer and back, every step
    assert all(r["devices"]["trainer"]["max"] > 1 for r in rows)


def test_static_and_dynarl_train_the_same_samples(runs):
    static = read_entries(os.path.join(runs["static"], "ledger.jsonl"))
    dynarl = read_entries(os.path.join(runs["dynarl"], "ledger.jsonl"))
    assert [e.step for e in dynarl] == [e.step for e in static] and len(static) >= 2
    for s, d in zip(static, dynarl):
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)
