"""The controller of a GRPO run loads no torch (~220 MB a process): it imports the
worker classes for their method references, and their modules import what needs
torch where it is used, in the ranks."""
import subprocess
import sys

CONTROLLER_MODULES = ["dynarl.launch.cli", "dynarl.launch.train_job", "dynarl.components.workflows.job",
                      "dynarl.components.workflows.grpo", "dynarl.components.workflows.agentic",
                      "dynarl.components.workflows.dynamic", "dynarl.components.workflows.partial",
                      "dynarl.components.workflows.overlap", "dynarl.components.rollout.worker",
                      "dynarl.components.trainer.worker", "dynarl.components.inference.worker",
                      "dynarl.components.reward.worker", "dynarl.components.reward.judge_worker",
                      "dynarl.components.backends"]

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            raise ImportError('torch imported by the controller')
sys.meta_path.insert(0, Block())
"""


def test_the_controllers_modules_import_without_torch():
    code = BLOCK_TORCH + "".join(f"import {m}\n" for m in CONTROLLER_MODULES)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_grpo_run_leaves_torch_out_of_its_controller(tmp_path):
    """A whole run (config checks, spawn, steps, summary): what the controller loads lazily counts too."""
    code = ("import sys\n"
            "from dynarl.launch.cli import main\n"
            f"sys.argv = ['dynarl', 'train', 'run.steps=1', '--run-dir', {str(tmp_path / 'run')!r}]\n"
            "failed = main()\n"
            "sys.exit(4 if failed else 3 if 'torch' in sys.modules else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
