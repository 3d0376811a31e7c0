"""The sandbox's seccomp filter, run here on a small classic-BPF evaluator: what it
answers per architecture and syscall (tests/test_tools_escapes.py runs it in the
kernel)."""
import errno
import struct

import pytest

from dynarl.components.tools import seccomp

ALLOW, EPERM, KILL = seccomp.RET_ALLOW, seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_KILL_PROCESS


def verdict(program: bytes, arch: int, nr: int) -> int:
    """What the kernel would return for syscall `nr` of `arch` (the instructions the
    filter uses: absolute word loads, jeq/jge on a constant, return a constant)."""
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iI", nr, arch) + bytes(56)  # struct seccomp_data
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.LD_ABS_W:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code in (seccomp.JEQ_K, seccomp.JGE_K):
            taken = acc == k if code == seccomp.JEQ_K else acc >= k
            pc += jt if taken else jf
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"instruction {code:#x} is not one the filter uses")
        pc += 1


X86, ARM = seccomp.AUDIT_ARCH["x86_64"], seccomp.AUDIT_ARCH["aarch64"]


@pytest.mark.parametrize("machine, arch, nr, expected", [
    ("x86_64", X86, 425, EPERM),      # io_uring_setup
    ("x86_64", X86, 319, EPERM),      # memfd_create
    ("x86_64", X86, 272, EPERM),      # unshare
    ("x86_64", X86, 0, ALLOW),        # read
    ("x86_64", X86, 56, ALLOW),       # clone (fork stays: the process limit bounds it)
    ("x86_64", X86, 435, ALLOW),      # clone3 (glibc's threads and fork)
    ("x86_64", X86, 279, ALLOW),      # x86_64's 279 is move_pages, not memfd_create
    ("x86_64", X86, 29, EPERM),       # shmget: System V IPC, refused whole
    ("x86_64", X86, 30, EPERM),       # shmat
    ("x86_64", X86, 64, EPERM),       # semget
    ("x86_64", X86, 68, EPERM),       # msgget
    ("x86_64", X86, 240, ALLOW),      # mq_open: POSIX queues, bounded by RLIMIT_MSGQUEUE
    ("x86_64", X86, 0x40000000 + 1, EPERM),  # x32 ABI: refused whole
    ("x86_64", 0x40000003, 3, KILL),  # i386 (int 0x80): another table, killed
    ("aarch64", ARM, 279, EPERM),     # memfd_create
    ("aarch64", ARM, 425, EPERM),     # io_uring_setup
    ("aarch64", ARM, 97, EPERM),      # unshare
    ("aarch64", ARM, 319, ALLOW),     # aarch64 has none above 294 but the unified ones: not denied
    ("aarch64", ARM, 63, ALLOW),      # read
    ("aarch64", ARM, 194, EPERM),     # shmget
    ("aarch64", ARM, 196, EPERM),     # shmat
    ("aarch64", ARM, 186, EPERM),     # msgget
    ("aarch64", ARM, 29, ALLOW),      # aarch64's 29 is ioctl
    ("aarch64", X86, 425, KILL),
])
def test_the_filter_refuses_what_it_lists_and_nothing_else(machine, arch, nr, expected):
    assert verdict(seccomp.filter_program(machine), arch, nr) == expected


@pytest.mark.parametrize("machine", sorted(seccomp.NUMBERS))
def test_every_denied_name_is_refused_on_every_machine(machine):
    program = seccomp.filter_program(machine)
    assert set(seccomp.NUMBERS[machine]) == set(seccomp.DENIED)
    for name in seccomp.DENIED:
        assert verdict(program, seccomp.AUDIT_ARCH[machine], seccomp.NUMBERS[machine][name]) == EPERM, name


def test_an_unknown_machine_has_no_filter():
    assert not seccomp.supported("riscv64")
    with pytest.raises(ValueError, match="no seccomp syscall table for 'riscv64'"):
        seccomp.filter_program("riscv64")
