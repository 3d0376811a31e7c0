NUM_GPUS = 0
"""Real-data path: a JSONL file of math prompts, malformed rows skipped and
counted, answers checked by math-verify, end to end through the workers."""

import json
import os
import subprocess
import sys

from grpo_tiny import TINY

# Runs a command and prints the peak RSS (MB) of the largest process under it
# (RUSAGE_CHILDREN: the command and every descendant it waited for).
PEAK_RSS = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
            "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10)")


def test_jsonl_math_dataset_end_to_end(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    lines = [json.dumps(r) for r in rows] + ["{broken", json.dumps({"prompt": "9+9="}), json.dumps({"q": 1})]
    (tmp_path / "math.jsonl").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("task.count_up")]
    result = subprocess.run(
        [sys.executable, "-m", "dynarl.launch.cli", "train", *tiny, "task.kind=dataset",
         f"task.dataset.path={tmp_path / 'math.jsonl'}", "run.steps=2", "rollout.max_new_tokens=4",
         "--run-dir", str(run)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "16 rows loaded, 3 skipped (row 17: not valid JSON" in result.stdout
    report = json.load(open(run / "data_report.json"))
    assert [s["row"] for s in report["skipped"]] == [17, 18, 19]
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [0, 1] and {m["verifier"] for m in metrics} == {"math-verify"}
    ledger = [json.loads(line) for line in open(run / "ledger.jsonl")]
    ids = [i for entry in ledger for i in entry["samples"]]
    assert len(ids) == len(set(ids)) == 2 * 8 * 4 and all(i.startswith("e0:r") for i in ids)
    assert os.path.isfile(run / "timeline.png")


def _train_peak_rss_mb(data, run):
    tiny = [a for a in TINY if not a.startswith("task.count_up")]
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "dynarl.launch.cli", "train", *tiny,
         "task.kind=dataset", f"task.dataset.path={data}", "run.steps=2", "rollout.max_new_tokens=4",
         "--run-dir", str(run)], capture_output=True, text=True, timeout=300, cwd=run.parent)
    code, peak_mb = map(int, result.stdout.split())
    assert code == 0, result.stderr[-2000:]
    return peak_mb


def test_hostile_rows_are_skipped_and_counted_within_a_clean_runs_memory(tmp_path):
    """One row must not end the job or its memory: deep nesting (RecursionError), a
    5000-digit number (int()'s limit), rows of 50 and 150 MB (over max_row_bytes:
    never read whole, never tokenized)."""
    rows = "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                   for a in range(4) for b in range(4))
    (tmp_path / "clean.jsonl").write_text(rows)
    with open(tmp_path / "hostile.jsonl", "w") as f:
        f.write(rows + "[" * 100_000 + "\n" + '{"prompt": "1+1=", "answer": ' + "7" * 5000 + "}\n")
        for size_mb in (50, 150):
            f.write('{"prompt": "')
            for _ in range(size_mb):
                f.write("x" * (1 << 20))
            f.write('", "answer": "1"}\n')
    clean_mb = _train_peak_rss_mb(tmp_path / "clean.jsonl", tmp_path / "clean")
    hostile_mb = _train_peak_rss_mb(tmp_path / "hostile.jsonl", tmp_path / "hostile")
    report = json.load(open(tmp_path / "hostile" / "data_report.json"))
    assert report["report"].startswith("16 rows loaded, 4 skipped")
    assert [(s["row"], s["reason"].split(" (")[0]) for s in report["skipped"]] == [
        (17, "JSON nested too deeply to read"), (18, "JSON not readable"),
        (19, "line of 52428829 bytes, more than task.dataset.max_row_bytes"),
        (20, "line of 157286429 bytes, more than task.dataset.max_row_bytes")]
    # the acceptance bound is 2x. Measured: 370 MB both; before, the nesting ended the
    # job and the 50 + 150 MB rows alone peaked at 3,086 MB (read whole, then tokenized)
    assert hostile_mb < 1.5 * clean_mb, (clean_mb, hostile_mb)
