"""`dynarl bench peers`: the same small GRPO job with dynarl and with TRL's GRPOTrainer,
side by side, interleaved.

    dynarl bench peers [--json] [--steps N] [--pairs P] [--workload short|long|both] [--trl-threads default,1]

The job (peers_job.py): a random-weight 1.04M-parameter Qwen2 HF folder with its own
BPE tokenizer, 256 `a+b=` rows, steps of 16 prompts x 8 samples, lr 3e-4, no KL, no
entropy bonus, no warm start, the math verifier. dynarl runs `dynarl train` on it (its
default CPU layout); TRL runs GRPOTrainer in a child process (peers_trl.py), once per
--trl-threads setting. A pair is one run of each, in alternating order; per pair the
bench takes dynarl's over TRL's median step time (the first --warmup steps of each run
left out) and peak memory of each process tree (the process and all its descendants,
sampled from /proc every 0.1 s: the sum of RSS, and of PSS, where shared pages are split
among the processes that map them). Below 1: dynarl is faster / smaller.

Needs trl (`pip install 'dynarl[peers]'`, or `pip install trl==1.16.0`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynarl.launch.bench import peers_job as job
from dynarl.launch.bench.peers_stats import RunResult, TreeSampler, pair_ratios

TIMEOUT_S = 1800
INSTALL = ("dynarl bench peers: trl is not installed; pip install trl==1.16.0 "
           "(or the peers extra: pip install 'dynarl[peers]')")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynarl bench peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, help="GRPO steps per run (default: short 4, long 2)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each run left out of its median")
    parser.add_argument("--pairs", type=int, default=2, help="interleaved pairs per workload (default 2)")
    parser.add_argument("--workload", choices=("short", "long", "both"), default="both")
    parser.add_argument("--trl-threads", default="default,1",
                        help="comma-separated torch thread counts for TRL; 'default': torch's own (default: default,1)")
    parser.add_argument("--keep", help="keep the runs' folders under this directory")
    parser.add_argument("--dynarl-args", default="", help="extra `dynarl train` key=value overrides for dynarl's "
                        "side, space-separated (e.g. 'rollout.num_ranks=1 trainer.num_ranks=1 inference.num_ranks=1')")
    return parser


def thread_settings(text: str) -> list[int | None]:
    """'default,1' -> [None, 1]."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "default":
            out.append(None)
        elif part.isdigit() and int(part) > 0:
            out.append(int(part))
        else:
            raise ValueError(f"--trl-threads: {part!r} is neither 'default' nor a positive int")
    return out


def side_name(threads: int | None) -> str:
    return "trl" if threads is None else f"trl-{threads}t"


def _run_tree(argv: list[str], log: Path) -> tuple[float, int, int]:
    """Runs argv in its own session, samples its tree; (wall s, peak RSS, peak PSS)."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeSampler(proc.pid).start()
        try:
            rc = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise RuntimeError(f"{argv[:4]} ran past {TIMEOUT_S} s (log: {log})")
        finally:
            sampler.stop()
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    if rc != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {rc}:\n{tail}")
    return time.perf_counter() - t0, sampler.peak_rss, sampler.peak_pss


def run_dynarl(model: Path, data: Path, workload: job.Workload, steps: int, where: Path,
               extra: tuple[str, ...] = ()) -> RunResult:
    run_dir = where / "run"
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train",
            *job.dynarl_argv(model, data, workload, steps, run_dir), *extra]
    wall, rss, pss = _run_tree(argv, where / "dynarl.log")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return RunResult("dynarl", [r["step_time_s"] for r in rows], [r["reward_mean"] for r in rows],
                     [r["response_len_mean"] for r in rows], [r["response_len_max"] for r in rows], rss, pss, wall)


def run_trl(model: Path, data: Path, workload: job.Workload, steps: int, where: Path, threads: int | None) -> RunResult:
    out = where / "trl.json"
    spec = where / "spec.json"
    spec.write_text(job.trl_spec(model, data, workload, steps, out, threads).to_json())
    wall, rss, pss = _run_tree([sys.executable, "-m", "dynarl.launch.bench.peers_trl", str(spec)], where / "trl.log")
    rows = json.loads(out.read_text())["steps"]
    return RunResult(side_name(threads), [r["step_s"] for r in rows], [r.get("reward", 0.0) for r in rows],
                     [r.get("mean_length") or 0.0 for r in rows], [r.get("max_length") or 0.0 for r in rows],
                     rss, pss, wall)


def order(pair: int, sides: list[str]) -> list[str]:
    """The sides' run order in pair `pair`: as given on even pairs, reversed on odd ones."""
    return list(sides) if pair % 2 == 0 else list(reversed(sides))


def bench_workload(workload: job.Workload, steps: int | None, pairs: int, threads: list[int | None], warmup: int,
                   root: Path, log=print, dynarl_extra: tuple[str, ...] = ()) -> dict:
    folder, data = root / workload.name / "model", root / "rows.jsonl"
    facts = job.build_model_folder(folder, workload)
    steps = steps or workload.default_steps
    sides = ["dynarl", *(side_name(t) for t in threads)]
    by_side = {side_name(t): t for t in threads}
    results = []
    for pair in range(pairs):
        summaries = {}
        for side in order(pair, sides):
            where = root / workload.name / f"pair{pair}" / side
            where.mkdir(parents=True, exist_ok=True)
            if side == "dynarl":
                result = run_dynarl(folder, data, workload, steps, where, dynarl_extra)
            else:
                result = run_trl(folder, data, workload, steps, where, by_side[side])
            summaries[side] = result.summary(warmup)
            log(f"  {workload.name} pair {pair} {side}: median step {summaries[side]['median_step_s']:.3f} s, "
                f"peak RSS {result.peak_rss / 1e6:.0f} MB, wall {result.wall_s:.0f} s")
        ratios = {side_name(t): pair_ratios(summaries["dynarl"], summaries[side_name(t)]) for t in threads}
        results.append({"pair": pair, "order": order(pair, sides), "runs": summaries, "ratios": ratios})
    return {"workload": workload.name, "steps": steps, "max_new_tokens": workload.max_new_tokens,
            "eos_bias": workload.eos_bias, "model": facts, "pairs": results, "summary": summarize(results, sides)}


def summarize(results: list[dict], sides: list[str]) -> dict:
    """Per side: medians over pairs of each figure; per peer: the median of the per-pair ratios."""
    out: dict = {"sides": {}, "ratios": {}}
    for side in sides:
        runs = [r["runs"][side] for r in results]
        out["sides"][side] = {k: statistics.median(run[k] for run in runs) for k in
                              ("median_step_s", "peak_rss_bytes", "peak_pss_bytes", "mean_length", "max_length",
                               "reward_first_half", "reward_last_half")}
    for side in sides[1:]:
        out["ratios"][side] = {k: statistics.median(r["ratios"][side][k] for r in results)
                               for k in ("step_time", "peak_rss", "peak_pss")}
    return out


def print_table(report: dict) -> None:
    print(f"dynarl bench peers: the first {report['warmup']} step(s) of each run left out of its median; "
          f"{report['pairs']} interleaved pairs; ratios are dynarl / peer (per pair, then the median of pairs)")
    for w in report["workloads"]:
        s = w["summary"]
        print(f"\n{w['workload']} ({w['steps']} steps a run, max_new_tokens {w['max_new_tokens']}, "
              f"{w['model']['params'] / 1e6:.2f}M params)")
        print(f"{'side':<10} {'median step s':>13} {'peak RSS MB':>11} {'peak PSS MB':>11} {'mean len':>8} "
              f"{'max len':>7} {'reward 1st/2nd half':>20}")
        for side, f in s["sides"].items():
            print(f"{side:<10} {f['median_step_s']:>13.3f} {f['peak_rss_bytes'] / 1e6:>11.0f} "
                  f"{f['peak_pss_bytes'] / 1e6:>11.0f} {f['mean_length']:>8.1f} {f['max_length']:>7.0f} "
                  f"{f['reward_first_half']:>10.3f}/{f['reward_last_half']:.3f}")
        for side, r in s["ratios"].items():
            per_pair = ", ".join(f"{p['ratios'][side]['step_time']:.2f}" for p in w["pairs"])
            print(f"dynarl/{side}: step time {r['step_time']:.2f}x (pairs: {per_pair}), peak RSS {r['peak_rss']:.2f}x, "
                  f"peak PSS {r['peak_pss']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print(INSTALL, file=sys.stderr)
        return 2
    try:
        threads = thread_settings(args.trl_threads)
    except ValueError as e:
        print(f"dynarl bench peers: {e}", file=sys.stderr)
        return 2
    if (args.steps is not None and args.steps < 1) or args.pairs < 1 or args.warmup < 0:
        print("dynarl bench peers: --steps and --pairs must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    names = ["short", "long"] if args.workload == "both" else [args.workload]
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    with tempfile.TemporaryDirectory(prefix="dynarl-peers-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        job.write_rows(root / "rows.jsonl", job.rows())
        t0 = time.perf_counter()
        extra = tuple(args.dynarl_args.split())
        workloads = [bench_workload(job.WORKLOADS[n], args.steps, args.pairs, threads, args.warmup, root, log, extra)
                     for n in names]
    report = {"steps": args.steps, "dynarl_args": list(extra), "warmup": args.warmup, "pairs": args.pairs,
              "cpus": os.cpu_count(),
              "load_avg": os.getloadavg(), "wall_s": time.perf_counter() - t0, "workloads": workloads}
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
