"""The component ranks meet the role Protocols core/ calls them by (core/roles.py):
mypy checks these returns ([tool.mypy] in pyproject.toml); nothing here runs."""
from __future__ import annotations

from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows.agentic_rollout import AgenticRolloutWorker
from dynarl.core.roles import LendingRank, MigratableRank, ReportingRank, ReshardableRank


def rollout(rank: RolloutWorker) -> tuple[MigratableRank, LendingRank, ReportingRank]:
    return rank, rank, rank


def agentic_rollout(rank: AgenticRolloutWorker) -> tuple[MigratableRank, LendingRank, ReportingRank]:
    return rank, rank, rank


def inference(rank: InferenceWorker) -> LendingRank:
    return rank


def trainer(rank: TrainerWorker) -> ReshardableRank:
    return rank
