"""core/remote.py: a remote call names its method by reference, checked against the group's class."""
import pytest

from dynarl.core.remote import method_name
from dynarl.core.roles import MigratableRank
from dynarl.core.worker_group import WorkerGroup
from workers import Counter, Echo


def nested_lambda():
    return lambda self: None


class Mover(Echo):
    async def workload_export(self):
        return []

    def _secret(self):
        return 0


@pytest.mark.parametrize("method, cls, expected", [
    (Echo.hello, Echo, "hello"),                           # async
    (Echo.env, Echo, "env"),                               # plain
    (Echo.hello, Mover, "hello"),                          # inherited
    (MigratableRank.workload_export, Mover, "workload_export"),  # a role Protocol's, implemented
    (Echo.hello, None, "hello"),                           # no class to check against
    ("hello", Echo, "by reference"),
    (lambda self: None, Echo, "by reference"),
    (nested_lambda(), None, "by reference"),                # f.<locals>.<lambda>: dotted, still no method
    (Mover._secret, Mover, "is private"),
    (Counter.add, Echo, "Echo has no method 'add'"),
    (MigratableRank.workload_export, Echo, "Echo has no method 'workload_export'"),
])
def test_method_name(method, cls, expected):
    if expected.isidentifier():
        assert method_name(method, cls) == expected
    else:
        with pytest.raises(TypeError, match=expected):
            method_name(method, cls)


class Unsent:
    """A rank's handle that records what would go on the wire."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, method, args=(), kwargs=None):
        self.sent.append(method)
        return method


async def test_a_group_call_with_a_method_its_class_lacks_fails_before_sending():
    handles = [Unsent(), Unsent()]
    group = WorkerGroup(None, "echo", Echo, handles)
    with pytest.raises(TypeError, match="Echo has no method 'add'"):
        await group.call(Counter.add, 1)
    with pytest.raises(TypeError, match="Echo has no method 'add'"):
        await group.on([1]).scatter(Counter.add, [[1]])
    assert [h.sent for h in handles] == [[], []]
    assert await group.on([1]).call(Echo.hello, 1) == ["hello"] and [h.sent for h in handles] == [[], ["hello"]]
