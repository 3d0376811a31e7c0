"""`dynarl sim`: the real controller and `dynarl train`'s workflows on emulated devices, in virtual time.

    scenario.py   the workload's batches, engines and the `dynarl train` config a policy runs
    runner.py     one policy's run: GRPO / AgenticGRPO steps, re-plans at a step's end
    online.py     an online policy's hooks inside each step: decide() every period,
                  its Migrate decisions carried out by migrate.py (over ranks.py, with
                  tail_tp.py's wider engines), its view from snapshot.py
    bound.py      work and critical-path lower bound of an iteration
    profiler.py   stage times at several device counts (for planners)
    metrics.py    per-policy figures from the run's records; report.py formats them
    sweep.py, parallel.py, plot.py, fidelity.py, engine_spread.py, cli.py
"""
