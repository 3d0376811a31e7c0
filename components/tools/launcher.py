"""Runs inside the sandbox, in front of the model's code.

The sandbox starts `python -I -c <this file's text> CPU_S AS_BYTES NPROC NOFILE FSIZE`
with the code on stdin, so this file may import only the standard library.
It sets the resource limits (the kernel enforces them; a child process inherits
them), installs an audit hook that turns network use and writes outside the
working folder into a readable "forbidden: ..." error, and runs the code as
`__main__`. The hook only words the error: the namespaces and read-only mounts
around the process are what contain it.
"""
import os
import resource
import signal
import sys
import traceback
import types

AF_UNIX = 1  # the only socket family allowed: asyncio's self-pipe, multiprocessing
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
NAME_LOOKUPS = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                "socket.gethostbyaddr", "socket.getnameinfo"}


def set_limits(cpu_s: int, memory: int, nproc: int, nofile: int, fsize: int) -> None:
    # The hard CPU limit one second later turns an ignored SIGXCPU into SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def cpu_limit_hit(signum: int, frame: object) -> None:
    # We are pid 1 of the sandbox's pid namespace, and the kernel does not apply a
    # signal's default action to pid 1: without this handler SIGXCPU would be ignored
    # and only the hard limit's SIGKILL, a second later, would stop the code.
    os._exit(128 + signum)


def deny(event: str, args: tuple) -> None:
    if event == "socket.__new__" and args[1] != AF_UNIX:
        raise PermissionError("forbidden: no network")
    if event in NAME_LOOKUPS:
        raise PermissionError("forbidden: no network")
    if event == "open" and isinstance(args[2], int) and args[2] & WRITE_FLAGS:
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        where = os.path.abspath(os.fsdecode(path))
        if not any(where == root or where.startswith(root + "/") for root in (os.getcwd(), "/tmp", "/dev")):
            raise PermissionError(f"forbidden: write outside the working folder ({where})")


def exit_code(code: object) -> int:
    # Exit codes above 127 are kept for "killed by a signal", as the sandbox reports those.
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code if 0 <= code <= 127 else 1
    print(code, file=sys.stderr)
    return 1


def run(code: bytes) -> int:
    try:
        compiled = compile(code, "<code>", "exec")
    except (SyntaxError, ValueError) as exc:
        traceback.print_exception(type(exc), exc, None)
        return 1
    # A fresh __main__ module: dataclasses, pickle and multiprocessing look the code up there.
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    try:
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        return exit_code(exc.code)
    except BaseException as exc:
        # Skip this file's frame: the model should see only its own code.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    return 0


def main() -> int:
    limits = [int(arg) for arg in sys.argv[1:6]]
    code = sys.stdin.buffer.read()
    # The code must not wait on the pipe it came in on.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.dont_write_bytecode = True
    signal.signal(signal.SIGXCPU, cpu_limit_hit)
    set_limits(*limits)
    sys.addaudithook(deny)
    return run(code)


if __name__ == "__main__":
    sys.exit(main())
