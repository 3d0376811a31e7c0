"""The component ranks meet the role Protocols core/ calls them by (core/roles.py),
and the rollout and inference ranks the policy-holder role the workflow loads
weights into: mypy checks these returns ([tool.mypy] in pyproject.toml)."""
from __future__ import annotations

from typing import Protocol

from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows.agentic_rollout import AgenticRolloutWorker
from dynarl.core.roles import LendingRank, MigratableRank, ReportingRank, ReshardableRank


class PolicyRank(Protocol):
    """A rank that holds the policy's weights (rollout, inference): what it holds, and a
    new version received over a weight-sync group."""

    def weight_version(self) -> int: ...

    async def receive_weights(self, group: str, version: int) -> int: ...


def policy(rollout: RolloutWorker, inference: InferenceWorker) -> tuple[PolicyRank, PolicyRank]:
    return rollout, inference


def rollout(rank: RolloutWorker) -> tuple[MigratableRank, LendingRank, ReportingRank]:
    return rank, rank, rank


def agentic_rollout(rank: AgenticRolloutWorker) -> tuple[MigratableRank, LendingRank, ReportingRank]:
    return rank, rank, rank


def inference(rank: InferenceWorker) -> LendingRank:
    return rank


def trainer(rank: TrainerWorker) -> ReshardableRank:
    return rank
