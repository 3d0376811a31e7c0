"""The sandbox's seccomp filter (pure: the program's bytes, no I/O here).

bubblewrap loads it (`--seccomp FD`) right before it starts the launcher, so the
launcher and the model's code run under it: the syscalls below fail with EPERM.
They are the kernel interfaces the namespaces and rlimits do not contain, or that
no checked-in Python needs:

- memory the limits do not count: memfd_create / memfd_secret (a memfd's pages
  are not the process's address space, so RLIMIT_AS does not see them), userfaultfd,
  and System V IPC whole (shared memory, semaphores, message queues): a segment
  outlives its mapping, so 8 x 256 MB segments were held under a 512 MB RLIMIT_AS,
  and the sandbox's own IPC namespace starts with the kernel's defaults (shmmax and
  shmall unbounded, 32000 message queues of 16 KB). POSIX shared memory and
  semaphores (shm_open, sem_open: what multiprocessing uses) are files in the
  sandbox's /dev/shm, bounded by its tmpfs;
- io_uring (its own path into the kernel, source of many privilege escalations),
  bpf, perf_event_open, the keyrings, ptrace and cross-process memory access;
- mounts, namespaces, modules, kexec, swap, reboot, accounting, quotas, and file
  handles (the last open files by handle, around the mount namespace).

The architecture is checked first (a syscall of another ABI is refused: the
filter would read its number wrong), and x86_64's x32 ABI is refused as a whole.
"""
from __future__ import annotations

import errno
import struct

SYSV_IPC = ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
            "msgget", "msgsnd", "msgrcv", "msgctl")
DENIED = ("memfd_create", "memfd_secret", "userfaultfd", *SYSV_IPC,
          "io_uring_setup", "io_uring_enter", "io_uring_register",
          "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
          "ptrace", "process_vm_readv", "process_vm_writev",
          "mount", "umount2", "pivot_root", "unshare", "setns",
          "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
          "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
          "swapon", "swapoff", "reboot", "acct", "quotactl", "name_to_handle_at", "open_by_handle_at",
          "fanotify_init")

# Syscall numbers: x86_64's from asm/unistd_64.h, aarch64's from asm-generic/unistd.h.
NUMBERS = {
    "x86_64": dict(memfd_create=319, memfd_secret=447, userfaultfd=323, io_uring_setup=425,
                   io_uring_enter=426, io_uring_register=427, bpf=321, perf_event_open=298, keyctl=250,
                   add_key=248, request_key=249, ptrace=101, process_vm_readv=310, process_vm_writev=311,
                   mount=165, umount2=166, pivot_root=155, unshare=272, setns=308, open_tree=428,
                   move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, init_module=175,
                   finit_module=313, delete_module=176, kexec_load=246, kexec_file_load=320, swapon=167,
                   swapoff=168, reboot=169, acct=163, quotactl=179, name_to_handle_at=303,
                   open_by_handle_at=304, fanotify_init=300, shmget=29, shmat=30, shmctl=31, shmdt=67,
                   semget=64, semop=65, semctl=66, semtimedop=220, msgget=68, msgsnd=69, msgrcv=70,
                   msgctl=71),
    "aarch64": dict(memfd_create=279, memfd_secret=447, userfaultfd=282, io_uring_setup=425,
                    io_uring_enter=426, io_uring_register=427, bpf=280, perf_event_open=241, keyctl=219,
                    add_key=217, request_key=218, ptrace=117, process_vm_readv=270, process_vm_writev=271,
                    mount=40, umount2=39, pivot_root=41, unshare=97, setns=268, open_tree=428,
                    move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, init_module=105,
                    finit_module=273, delete_module=106, kexec_load=104, kexec_file_load=294, swapon=224,
                    swapoff=225, reboot=142, acct=89, quotactl=60, name_to_handle_at=264,
                    open_by_handle_at=265, fanotify_init=262, msgget=186, msgctl=187, msgrcv=188,
                    msgsnd=189, semget=190, semctl=191, semtimedop=192, semop=193, shmget=194, shmctl=195,
                    shmat=196, shmdt=197),
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# classic BPF, as seccomp runs it over struct seccomp_data {int nr; u32 arch; ...}
LD_ABS_W, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
NR_OFFSET, ARCH_OFFSET = 0, 4
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000


def supported(machine: str) -> bool:
    return machine in NUMBERS


def filter_program(machine: str) -> bytes:
    """The filter for `machine` (os.uname().machine) as bwrap reads it: struct
    sock_filter records {u16 code, u8 jt, u8 jf, u32 k}, native byte order."""
    if machine not in NUMBERS:
        raise ValueError(f"no seccomp syscall table for {machine!r}; have {', '.join(NUMBERS)}")
    numbers = sorted({NUMBERS[machine][name] for name in DENIED})
    deny = RET_ERRNO | errno.EPERM
    code = [(LD_ABS_W, 0, 0, ARCH_OFFSET), (JEQ_K, 1, 0, AUDIT_ARCH[machine]), (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_ABS_W, 0, 0, NR_OFFSET)]
    checks = ([(JGE_K, X32_SYSCALL_BIT)] if machine == "x86_64" else []) + [(JEQ_K, n) for n in numbers]
    # each check jumps to the deny at the end when it matches: past the checks after
    # it and the allow
    for index, (op, k) in enumerate(checks):
        code.append((op, len(checks) - index, 0, k))
    code += [(RET_K, 0, 0, RET_ALLOW), (RET_K, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in code)
