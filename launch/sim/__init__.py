"""`dynarl sim`: the real controller and `dynarl train`'s workflows on emulated devices, in virtual time.

    scenario.py   the workload's batches, engines and the `dynarl train` config a policy runs
    runner.py     one policy's run: GRPO / AgenticGRPO steps, re-plans at a step's end;
                  an online policy's moves are the job's own scheduler's
                  (scheduler.policy dynarl: components/workflows/dynamic.py)
    bound.py      work and critical-path lower bound of an iteration
    profiler.py   stage times at several device counts (for planners)
    metrics.py    per-policy figures from the run's records; report.py formats them
    sweep.py, parallel.py, plot.py, fidelity.py, engine_spread.py, cli.py
"""
