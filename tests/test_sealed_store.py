"""A process group's store sealed under the job secret (transport/sealed_store.py): what
members get through c10d's PrefixStore equals a plain TCPStore's answers, and what an
outsider connected to the same TCPStore lists, reads or writes gets it nothing."""
NUM_GPUS = 0

import datetime
import re

import pytest
import torch.distributed as dist

from dynarl.transport.process_group import host_store
from dynarl.transport.sealed_store import SealedStore, StoreTampered, build_key

SECRET = b"job-secret-for-these-tests-32by"
PREFIX = "dynarl/dp/1/0123456789abcdef"


@pytest.fixture
def server():
    return host_store("127.0.0.1")


def _client(server, timeout_s=5.0):
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def _member(server, secret=SECRET, prefix=PREFIX):
    """A member's view: c10d's PrefixStore over the sealed store, as join_group builds it
    (each call goes C++ -> the pybind trampoline -> SealedStore)."""
    sealed = SealedStore(_client(server), build_key(secret, prefix))
    return dist.PrefixStore(prefix, sealed), sealed


def _exercise(store):
    """Every Store call c10d makes, in an order whose answers a plain TCPStore fixes."""
    out = []
    store.set("a", b"alpha")
    out.append(store.get("a"))
    out.append(store.check(["a"]))
    out.append(store.check(["a", "missing"]))
    store.wait(["a"])
    store.wait(["a"], datetime.timedelta(seconds=1))
    out.append(store.add("n", 3))
    out.append(store.add("n", 4))
    out.append(store.get("n"))
    out.append(store.compare_set("c", b"", b"first"))      # missing, expected empty: set
    out.append(store.compare_set("c", b"wrong", b"x"))     # present, not expected: what is there
    out.append(store.compare_set("c", b"first", b"second"))
    out.append(store.compare_set("gone", b"x", b"y"))      # missing, expected given: `expected`
    out.append(store.check(["gone"]))
    store.append("log", b"ab")
    store.append("log", b"cd")
    out.append(store.get("log"))
    store.multi_set(["m1", "m2"], [b"one", b"two"])
    out.append(store.multi_get(["m1", "m2"]))
    out.append(store.delete_key("m1"))
    out.append(store.check(["m1"]))
    store.barrier("b", 1)
    clone = store.clone()
    clone.set("k", b"from a clone")
    out.append(store.get("k"))
    return out


def test_members_get_what_a_plain_tcpstore_answers(server):
    plain = dist.PrefixStore("plain", _client(server))
    member, _ = _member(server)
    assert _exercise(member) == _exercise(plain)


def test_an_outsider_lists_hashes_and_reads_ciphertext(server):
    member, _ = _member(server)
    secrets = {"0/0": b"10.1.2.3:45678 gloo address", "UniqueNCCLID:0": b"\x02\x00nccl-id" * 8}
    for key, value in secrets.items():
        member.set(key, value)
    member.add("barrier/1", 1)
    outsider = _client(server)
    names = outsider.list_keys()
    assert len(names) == 3
    assert all(re.fullmatch("[0-9a-f]{32}", n) for n in names), names
    values = [outsider.get(n) for n in names]
    for plaintext in [*secrets.values(), PREFIX.encode()]:
        assert not any(plaintext in value for value in values)
    assert not any(v.isdigit() for v in values)  # the counter is sealed too, not a decimal


def test_another_secret_or_build_finds_nothing(server):
    member, _ = _member(server)
    member.set("0/0", b"address")
    for secret, prefix in [(b"another job's secret, 32 bytes!", PREFIX), (SECRET, PREFIX + "x")]:
        other, _ = _member(server, secret, prefix)
        assert not other.check(["0/0"])
    assert build_key(SECRET, PREFIX) != build_key(SECRET, PREFIX + "x")
    with pytest.raises(ValueError, match="16 bytes"):
        build_key(b"short", PREFIX)


def test_a_value_an_outsider_writes_or_moves_is_refused(server):
    member, _ = _member(server)
    member.set("0/0", b"rank 0's address")
    member.set("0/1", b"rank 1's address")
    member.add("count", 1)
    outsider = _client(server)
    names = outsider.list_keys()
    by_name = {n: outsider.get(n) for n in names}
    # every key gets another key's sealed value (a valid ciphertext, for another name)
    for name, value in zip(names, [by_name[n] for n in names[1:] + names[:1]]):
        outsider.set(name, value)
    for key in ("0/0", "0/1"):
        with pytest.raises(StoreTampered, match="does not open"):
            member.get(key)
    with pytest.raises(StoreTampered):
        member.add("count", 1)
    # forged outright, as a count would be written in a plain TCPStore
    for name in names:
        outsider.set(name, b"41")
    with pytest.raises(StoreTampered):
        member.get("0/0")
    with pytest.raises(StoreTampered):
        member.add("count", 1)
