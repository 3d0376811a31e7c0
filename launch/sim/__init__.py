"""`dynarl sim`: the real controller and workflow on emulated devices, in virtual time.

    workers: rollout_worker.py, inference_worker.py, trainer_worker.py
    runner.py     one policy's run: spawn groups per placement, iterate, apply decisions
    iteration.py  one GRPO iteration over channels (components/workflows/stages.py)
    bound.py      work and critical-path lower bound of an iteration
    profiler.py   stage times at several device counts (for planners)
    metrics.py    per-policy figures from the run's records; report.py formats them
    plot.py, fidelity.py, cli.py
"""
