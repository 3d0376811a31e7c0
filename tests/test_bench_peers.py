NUM_GPUS = 0
"""`dynarl bench peers`: its pure parts table-tested without trl (process-tree memory
from /proc tables, medians after the warm-up, ratios, the reward curve's halves, the
job's two command lines), and one small end-to-end run against TRL's GRPOTrainer,
skipped when trl is not installed."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import pytest

from dynarl.launch.bench import peers, peers_job as job
from dynarl.launch.bench.peers_stats import (Proc, RunResult, TreeSampler, descendants, halves, median_after_warmup,
                                             pair_ratios, reads_pss, tree_memory)

TABLE = {1: Proc(0, 10), 100: Proc(1, 1000, 600), 101: Proc(100, 200, 150), 102: Proc(100, 300),
         103: Proc(101, 50, 40), 200: Proc(1, 7000, 7000)}
"""init (1), the bench's child 100 with children 101 and 102, a grandchild 103, a stranger 200."""


@pytest.mark.parametrize("root, pids, rss, pss", [
    (100, {100, 101, 102, 103}, 1550, 1090),  # a process without PSS counts its RSS (102: 300)
    (101, {101, 103}, 250, 190),
    (103, {103}, 50, 40),
    (999, set(), 0, 0),  # gone: nothing
])
def test_a_tree_is_its_root_and_every_descendant_and_nothing_else(root, pids, rss, pss):
    assert descendants(root, TABLE) == pids
    assert tree_memory(root, TABLE) == (rss, pss)


def test_a_ppid_loop_does_not_hang():
    assert descendants(5, {5: Proc(6, 1), 6: Proc(5, 1)}) == {5, 6}


def test_the_sampler_sees_a_child_of_the_root_and_keeps_the_peak():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(30)"])
    try:
        sampler = TreeSampler(os.getpid())
        deadline = time.monotonic() + 60  # a hang bound: a loaded host takes a while to start the child
        while time.monotonic() < deadline:  # until the child has its 64 MB
            sampler.sample()
            with open(f"/proc/{child.pid}/statm") as f:
                if int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") > 64 << 20:
                    break
            time.sleep(0.05)
        sampler.sample()
        with open("/proc/self/statm") as f:
            mine = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert sampler.peak_rss >= mine + (64 << 20)
        assert 0 < sampler.peak_pss <= sampler.peak_rss
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("times, warmup, median", [
    ([9.0, 1.0, 2.0, 3.0], 1, 2.0),
    ([9.0, 1.0, 2.0], 1, 1.5),
    ([9.0, 8.0, 1.0], 2, 1.0),
    ([9.0], 1, 9.0),  # too few: all of them
    ([4.0, 1.0], 0, 2.5),
])
def test_the_median_leaves_out_the_warm_up(times, warmup, median):
    assert median_after_warmup(times, warmup) == median


@pytest.mark.parametrize("values, first, last", [
    ([0.0, 1.0], 0.0, 1.0),
    ([0.0, 0.5, 1.0], 0.25, 0.75),  # the middle one in both
    ([0.2, 0.2, 0.4, 0.8], 0.2, 0.6),
    ([0.3], 0.3, 0.3),
])
def test_the_reward_curve_halves(values, first, last):
    assert halves(values) == pytest.approx((first, last))


def _result(side, step_s, rss, pss):
    return RunResult(side, step_s, [0.0, 1.0], [30.0, 32.0], [32.0, 32.0], rss, pss, 10.0).summary(1)


def test_ratios_are_dynarl_over_the_peer_per_pair_and_the_summary_their_median():
    pairs = []
    for d, t in (([5.0, 1.0, 1.0], [5.0, 2.0, 2.0]), ([5.0, 3.0, 3.0], [5.0, 4.0, 4.0]),
                 ([5.0, 1.0, 1.0], [5.0, 4.0, 4.0])):
        runs = {"dynarl": _result("dynarl", d, 300, 200), "trl": _result("trl", t, 100, 100)}
        pairs.append({"runs": runs, "ratios": {"trl": pair_ratios(runs["dynarl"], runs["trl"])}})
    assert [p["ratios"]["trl"]["step_time"] for p in pairs] == [0.5, 0.75, 0.25]
    assert pairs[0]["ratios"]["trl"]["peak_rss"] == 3.0 and pairs[0]["ratios"]["trl"]["peak_pss"] == 2.0
    summary = peers.summarize(pairs, ["dynarl", "trl"])
    assert summary["ratios"]["trl"]["step_time"] == 0.5
    assert summary["sides"]["dynarl"]["median_step_s"] == 1.0
    assert summary["sides"]["trl"]["mean_length"] == 31.0
    assert summary["sides"]["trl"]["reward_first_half"] == 0.0 and summary["sides"]["trl"]["reward_last_half"] == 1.0


@pytest.mark.parametrize("text, settings", [("default,1", [None, 1]), ("1", [1]), ("default", [None]),
                                            (" 2 , default", [2, None])])
def test_trl_thread_settings(text, settings):
    assert peers.thread_settings(text) == settings


@pytest.mark.parametrize("text", ["0", "two", "1,", "-1"])
def test_a_bad_trl_thread_setting_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match="--trl-threads"):
        peers.thread_settings(text)


def test_pairs_alternate_the_order_of_the_sides():
    sides = ["dynarl", "trl", "trl-1t"]
    assert [peers.order(p, sides) for p in range(3)] == [sides, sides[::-1], sides]


def test_rows_are_sums_and_the_same_every_time():
    rows = job.rows()
    assert len(rows) == 256 and rows == job.rows()
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("+")
        assert row["prompt"].endswith("=") and row["answer"] == str(int(a) + int(b))


def test_the_tokenizer_round_trips_the_task_and_has_its_eos():
    tok = job.train_tokenizer(job.rows())
    ids = tok.encode("12+34=46").ids
    assert tok.decode(ids) == "12+34=46" and len(ids) < 8
    assert tok.token_to_id(job.EOS) is not None


def test_the_dynarl_command_line_is_a_valid_config_of_the_job(tmp_path):
    from dynarl.launch.train import parse_args
    from dynarl.launch.train_prepare import resolve_config
    workload = job.WORKLOADS["long"]
    (tmp_path / "m").mkdir()  # the folder's config.json is all the config's check reads
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen2", **job.model_config_kwargs(446, 0)}))
    job.write_rows(tmp_path / "r.jsonl", job.rows())
    config_path, overrides, run_dir, _ = parse_args(job.dynarl_argv(tmp_path / "m", tmp_path / "r.jsonl", workload,
                                                                    3, tmp_path / "run"))
    cfg = resolve_config(config_path, overrides, None)
    assert run_dir == str(tmp_path / "run")
    assert (cfg.run.steps, cfg.run.prompts_per_step, cfg.rollout.samples_per_prompt) == (3, 16, 8)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (256, 1.0)
    assert cfg.trainer.engine.lr == 3e-4 and cfg.trainer.engine.entropy_coef == 0 and cfg.trainer.engine.kl_coef == 0
    assert cfg.trainer.warmup.steps == 0 and cfg.task.verifier == "math"


def test_the_trl_spec_takes_one_step_of_the_same_samples(tmp_path):
    spec = job.trl_spec(tmp_path / "m", tmp_path / "r.jsonl", job.WORKLOADS["short"], 3, tmp_path / "o.json", 1)
    assert spec.per_device_train_batch_size * spec.gradient_accumulation_steps == 16 * 8
    assert (spec.num_generations, spec.max_new_tokens, spec.lr, spec.threads) == (8, 32, 3e-4, 1)
    assert json.loads(spec.to_json())["steps"] == 3


def test_the_long_workload_biases_the_eos_logit():
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**job.model_config_kwargs(300, 0)))
    ids = torch.randint(0, 300, (4, 16))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        job.bias_eos(model, 0, 2.0)
        after = model(input_ids=ids).logits
    lift = (after[..., 0] - after[..., 1:].mean(-1)) - (before[..., 0] - before[..., 1:].mean(-1))
    assert 1.0 < float(lift.mean()) < 3.0


def test_the_model_has_the_issues_size():
    kw = job.model_config_kwargs(446, 0)
    h, inter, v, layers = kw["hidden_size"], kw["intermediate_size"], kw["vocab_size"], kw["num_hidden_layers"]
    kv = h // kw["num_attention_heads"] * kw["num_key_value_heads"]
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    assert 1.0e6 < layers * per_layer + 2 * v * h + h < 1.08e6


def test_without_trl_it_says_how_to_install_it(monkeypatch, capsys):
    real = peers.importlib.util.find_spec
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    assert peers.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install trl==1.16.0" in err


def test_a_short_run_of_both_sides_reports_its_figures(tmp_path):
    pytest.importorskip("trl", reason="trl is not installed (pip install trl==1.16.0): the TRL side cannot run")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = peers.main(["--json", "--steps", "2", "--pairs", "1", "--workload", "short", "--trl-threads", "1",
                           "--keep", str(tmp_path)])
    assert code == 0
    report = json.loads(out.getvalue())
    (w,) = report["workloads"]
    assert w["workload"] == "short" and w["steps"] == 2
    for side in ("dynarl", "trl-1t"):
        f = w["summary"]["sides"][side]
        assert f["median_step_s"] > 0 and f["peak_rss_bytes"] > 50e6
        assert 1 <= f["mean_length"] <= 32 and f["max_length"] <= 32
        assert 0 <= f["reward_first_half"] <= 1
    assert w["summary"]["ratios"]["trl-1t"]["step_time"] > 0
    assert len(w["pairs"][0]["runs"]["dynarl"]["step_s"]) == 2


@pytest.mark.parametrize("rss, peak, since, reads", [
    (100, 90, 0.0, True),     # a new RSS peak: read at once
    (95, 100, 0.2, False),    # near the peak, read 0.2 s ago
    (95, 100, 0.5, True),     # near the peak, due
    (80, 100, 5.0, False),    # far below the RSS peak: skipped
    (0, 0, 0.0, False),
])
def test_pss_is_read_at_rss_peaks_and_near_them_now_and_then(rss, peak, since, reads):
    assert reads_pss(rss, peak, since, 0.5) is reads
