"""Placement decisions, pure: which devices each component holds, and when.

No torch, no zmq, no I/O: plans are functions of numbers (device counts, work,
profiled stage times), tested with tables. `dynarl sim` and real runs use the
same modules.

    plan.py      Placement: segments of the workflow chain, each on its own devices
    split.py     the fixed spatial split rule
    profile.py   profiled stage times at several device counts, interpolated
    planner.py   RLinf's planner: dynamic program over cuts of the chain
    drift.py     re-plan trigger: measured stage times drift from the profile
    context.py   what a policy is given (PlanContext, Snapshot) and returns (Replan)
    policy.py    named policies (placement + optional online decide hook), registry
    dynarl.py    dynarl and its variants; agentic.py: their request handling
    embodied.py  the embodied workflow's placements (env workers, policy, learner)
"""
