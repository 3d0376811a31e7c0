"""The reward worker (components/reward/worker.py): a process with no torch in it, the
math verifier's references parsed once, and the number of its ranks checked at load."""
import subprocess
import sys

import pytest

from dynarl.components.reward.config import RewardSection, reward_ranks
from dynarl.components.reward.verifiers import MathVerifier
from dynarl.launch.bench.peers_job import WORKLOADS, build_model_folder


def test_a_reward_worker_on_an_hf_folder_imports_no_torch(tmp_path):
    """Each reward rank is a process of its own: without torch it costs ~70 MB, with it
    ~280 (the folder's config was read through the torch-importing model io)."""
    build_model_folder(tmp_path / "model", WORKLOADS["short"])
    code = ("import sys\n"
            "from dynarl.components.model.spec import ModelSpec\n"
            "from dynarl.components.reward.worker import RewardWorker\n"
            "from dynarl.components.trainer.base import TrainerConfig\n"
            f"w = RewardWorker(ModelSpec(path={str(tmp_path / 'model')!r}), 'math', 1e-6, TrainerConfig(), None)\n"
            "assert w.verify('so 3+4=7', '7') == 1.0 and w.verify('it is 8', '7') == 0.0\n"
            "sys.exit(3 if 'torch' in sys.modules else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_math_verifier_parses_each_reference_once_and_scores_as_before():
    verifier = MathVerifier()
    assert verifier.backend == "math-verify"  # a dependency
    scores = [verifier(response, answer) for response, answer in
              [("7", "7"), ("x = 7", "7"), ("8", "7"), ("\\frac{1}{2}", "0.5"), ("", "7"), ("7", "7")]]
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    info = verifier._gold.cache_info()
    assert (info.misses, info.hits) == (2, 4)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_reward_ranks_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="num_ranks must be an integer >= 1"):
        RewardSection(num_ranks=value)


@pytest.mark.parametrize("configured, rollout_ranks, cores, ranks", [
    (None, 2, 2, 2), (None, 1, 2, 1), (None, 64, 16, 16), (None, 4, 1, 1), (3, 1, 2, 3), (1, 8, 8, 1),
])
def test_reward_ranks_follow_the_rollout_ranks_up_to_the_cores_unless_set(configured, rollout_ranks, cores, ranks):
    assert reward_ranks(configured, rollout_ranks, cores) == ranks
    RewardSection(num_ranks=configured)  # null and a positive integer load
