"""The episode driver's side of carrying a context's KV to the rank a follow-up turn
goes to when the rank that served its last turn leaves (rollout.move_kv)."""
import asyncio
from collections import Counter

from dynarl.components.workflows.episodes import Episode, EpisodeDriver
from dynarl.components.rollout.turn import TurnResult


class HeldTool:
    """Each turn's tool call waits until the test lets it go; every episode has two turns."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.calls_by_tool: Counter = Counter()

    def budget(self, ep: Episode) -> int:
        return 4

    def tool_count(self, ep: Episode) -> int:
        return ep.tool_calls

    async def reply(self, ep: Episode, out: list[int], finish: str) -> list[int] | None:
        if ep.turns >= 2:
            ep.finish = "answer"
            return None
        await self.go.wait()
        return [9, 9]


async def test_a_leaving_ranks_offer_goes_with_the_next_turn_to_another_rank_only():
    submitted, ended = [], []

    async def submit(rank, turn):
        submitted.append((rank, turn))

    async def end(rank):
        ended.append(rank)

    tool = HeldTool()
    driver = EpisodeDriver(tool, ["a", "b"], submit, end=end)
    ep = Episode("e", [1, 2, 3], seed=0)
    ep.status.affinity = "prefer"
    driver.live[ep.id] = ep
    await driver.route(ep)
    first_rank = submitted[0][0]
    other = "b" if first_rank == "a" else "a"
    # its first turn finishes: the tool runs (held), the episode is between turns
    reply = asyncio.ensure_future(driver.on_result(ep, TurnResult(id="e#0", output_ids=[5, 6], logprobs=[0.0, 0.0],
                                                        finish="stop", version=0, cached_tokens=0,
                                                        wait_s=0.0, rank=first_rank)))
    await asyncio.sleep(0)
    assert driver.between_turns(first_rank) == [ep] and driver.between_turns(other) == []
    driver.stop_routing([first_rank])
    driver.carry(ep, "e#0", [16, "payload"], 0, first_rank)  # a stale turn id: not carried
    assert driver.carried == {}
    driver.carry(ep, "e#1", [16, "payload"], 0, first_rank)
    await driver.leave([first_rank])
    assert ended == [first_rank]
    tool.go.set()
    assert await reply is False
    rank, turn = submitted[-1]
    assert rank == other and turn.id == "e#1" and turn.kv == [[16, "payload"]] and turn.node == 0
    assert driver.carried == {}


async def test_a_rank_that_stops_being_routed_to_gets_its_end_once_when_the_run_closes_first():
    ended = []

    async def end(rank):
        ended.append(rank)

    async def submit(rank, turn):
        pass

    driver = EpisodeDriver(HeldTool(), ["a", "b"], submit, end=end)
    driver.stop_routing(["a"])  # a migration is offering rank a's KV ...
    await driver.close()        # ... when the last episode ends
    await driver.leave(["a"])   # then the migration lets it leave: no second END
    assert sorted(ended) == ["a", "b"]
