"""What a sandboxed interpreter runs first: `python -B -s -S sandbox_child.py CPU_S AS FSIZE NOFILE NPROC WALL_S
CONTAIN REPORT_FD`, CONTAIN 1 when it runs in its own namespaces (`contain_filesystem` then runs first),
REPORT_FD a pipe for how the worker ended (-1: none).

Standard library only: the interpreter starts without site-packages, so minirl is not importable.

The process forks once. The parent stays as a tiny init (pid 1 of the run's pid namespace when
there is one: it ignores signals sent from inside, and when it exits the kernel kills whatever
the run left behind) and exits with the worker's status, 128 + N when signal N killed it, after writing
"exit N" or "signal N" to REPORT_FD (the exit status alone cannot tell sys.exit(152) from SIGXCPU). It also
kills the worker a second after WALL_S, in case the process that started the run died and cannot.
The worker lowers its resource limits, installs an audit hook that refuses what the sandbox does not
allow, and runs `main.py` from its working directory as `__main__`; an uncaught exception prints
its traceback from the first frame of `main.py` on and exits 1.

The audit hook (PEP 578) refuses: creating processes, signalling other processes, sockets,
ctypes, changing resource limits, changing permissions or making links, writing, deleting or
renaming anything outside the working directory, opening a directory outside it (a `dir_fd`
could otherwise reach out), and reading another process's `/proc/<pid>`. A hook runs inside the
process it guards, so it stops mistakes and casual escapes, not a determined exploit of CPython.
"""

import errno
import itertools
import os
import posix
import re
import resource
import runpy
import signal
import sys
import traceback

SCRIPT = "main.py"

_DENIED_EVENTS = frozenset(
    {
        "os.system",
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "subprocess.Popen",
        "os.kill",
        "os.killpg",
        "resource.setrlimit",
        "resource.prlimit",
        "os.chmod",
        "os.chown",
        "os.chflags",
        "os.lchflags",
        "os.lchmod",
        "os.lchown",
        "os.symlink",
        "os.link",
        "os.setxattr",
        "os.removexattr",
    }
)
_DENIED_PREFIXES = ("socket.", "ctypes.")
# process creation without an audit event (subprocess needs it) and foreign function calls
_DENIED_IMPORTS = frozenset({"_posixsubprocess", "_ctypes"})
# event -> (index of a path the event changes, index of its dir_fd argument or None), per path
_CHANGED_PATHS = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.truncate": ((0, None),),
    "os.utime": ((0, 3),),
    "shutil.rmtree": ((0, 1),),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROC_PID = re.compile(r"/proc/(\d+)(/|$)")
# mount(2) flags (linux/mount.h); a remount must repeat a mount's nosuid, nodev, noexec and atime flags
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
_KEPT_MOUNT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": 8,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")  # a space in a mount point reads \040


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, the flags a remount must keep) of each mount this process sees."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            points.append((point, sum(_KEPT_MOUNT_FLAGS.get(option, 0) for option in fields[5].split(","))))
    return points


def contain_filesystem(workdir: str, disk_bytes: int) -> None:
    """In the run's own mount namespace (the `unshare` the sandbox starts it under): the working directory
    becomes a fresh tmpfs of `disk_bytes` holding a copy of `main.py`, and every other mount read-only.
    The code can then change nothing outside its working directory whatever it does to the audit hook,
    and what it writes disappears with the namespace."""
    import ctypes  # the audit hook refuses ctypes; it is not installed yet

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(target: str, flags: int, fstype: bytes | None = None, data: bytes | None = None) -> int:
        return 0 if libc.mount(fstype, target.encode(), fstype, flags, data) == 0 else ctypes.get_errno()

    with open(SCRIPT, "rb") as f:
        code = f.read()
    points = _mount_points()
    error = mount(workdir, MS_NOSUID | MS_NODEV, b"tmpfs", f"size={disk_bytes},mode=700".encode())
    if error:
        raise OSError(error, f"mounting a tmpfs on the working directory: {os.strerror(error)}")
    for point, kept in points:
        error = mount(point, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
        # EINVAL: a mount hidden under another one (the run's own /proc covers the machine's)
        if error and error != errno.EINVAL:
            raise OSError(error, f"making {point} read-only: {os.strerror(error)}")
    os.chdir(workdir)  # into the tmpfs
    with open(SCRIPT, "wb") as f:
        f.write(code)


def set_limits(cpu_s: int, address_space: int, file_size: int, open_files: int, processes: int) -> None:
    """Lower soft and hard limits together, so the code cannot raise them again."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU at the soft limit, SIGKILL one s later
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))  # stdout and stderr are files too
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _deny(what: str) -> None:
    raise PermissionError(f"{what} is not allowed in this sandbox")


class Guard:
    """The audit hook: `workdir` is the only tree the code may change."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.pid = str(os.getpid())
        # the capture files behind stdout and stderr stay writable by name (/dev/stdout)
        self.writable = {"/dev/null", *(os.path.realpath(f"/proc/self/fd/{fd}") for fd in (1, 2))}

    def _resolve(self, path, dir_fd) -> str | None:
        if isinstance(path, int):  # an open file descriptor: its open was checked
            return None
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd not in (None, -1) else os.getcwd()
        return os.path.realpath(os.path.join(base, os.fsdecode(path)))

    def _inside(self, real: str) -> bool:
        return real == self.workdir or real.startswith(self.workdir + os.sep) or real in self.writable

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open":
            self._check_open(args[0], args[2])  # (path, mode, flags)
        elif event in _CHANGED_PATHS:
            for path_index, fd_index in _CHANGED_PATHS[event]:
                dir_fd = args[fd_index] if fd_index is not None and fd_index < len(args) else None
                real = self._resolve(args[path_index], dir_fd)
                if real is not None and not self._inside(real):
                    _deny(f"{event} outside the working directory ({real})")
            if event == "os.mkdir" and args[1] & 0o700 != 0o700:
                _deny("a directory its owner cannot use")  # it could not be cleaned up
        elif event == "import" and args[0] in _DENIED_IMPORTS:
            raise ImportError(f"importing {args[0]} is not allowed in this sandbox")
        elif event in _DENIED_EVENTS or event.startswith(_DENIED_PREFIXES):
            _deny(event)

    def _check_open(self, path, flags: int) -> None:
        real = self._resolve(path, None)
        if real is None:
            return
        if (flags & _WRITE_FLAGS or os.path.isdir(real)) and not self._inside(real):
            _deny(f"opening {real} for writing, or a directory, outside the working directory")
        match = _PROC_PID.match(real)
        if match and match.group(1) != self.pid:
            _deny(f"reading another process's {match.group(0)}")


def _print_traceback(err: BaseException) -> None:
    """As Python prints it, from the model's first frame on and without the guard's frames."""
    top = traceback.TracebackException.from_exception(err)
    frames = list(top.stack)
    top.stack = frames[next((i for i, f in enumerate(frames) if f.filename == SCRIPT), len(frames)) :]
    parts = [top]
    while parts:  # the exception and those chained to it
        part = parts.pop()
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if f.filename != __file__])
        parts += [chained for chained in (part.__cause__, part.__context__) if chained is not None]
    sys.stderr.write("".join(top.format()))


def run_worker(limits: list[int]) -> None:
    set_limits(*limits)
    sys.path[0] = os.getcwd()  # as for `python main.py`, not this file's directory
    # no audit event covers these: they would reach other processes by pid or leave the process group
    for module, name in itertools.product((os, posix), ("pidfd_open", "setsid", "setpgid", "setpgrp")):
        module.__dict__.pop(name, None)
    signal.__dict__.pop("pidfd_send_signal", None)
    sys.addaudithook(Guard(os.path.realpath(os.getcwd())))
    try:
        runpy.run_path(SCRIPT, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as err:  # the model's own error: show it as Python would
        _print_traceback(err)
        sys.exit(1)


def main() -> None:
    *limits, wall_s, contain, report_fd = (int(arg) for arg in sys.argv[1:])
    if contain:
        contain_filesystem(os.path.realpath(os.getcwd()), limits[2])  # a tmpfs as large as one file may be
    worker = os.fork()
    if worker == 0:
        if report_fd >= 0:
            os.close(report_fd)  # the code cannot write the report
        run_worker(limits)
        return
    signal.signal(signal.SIGALRM, lambda *_: os.kill(worker, signal.SIGKILL))
    signal.alarm(wall_s + 1)
    _, status = os.waitpid(worker, 0)
    code = os.waitstatus_to_exitcode(status)
    if report_fd >= 0:  # an exit status of 152 alone would read as SIGXCPU
        os.write(report_fd, (f"exit {code}" if code >= 0 else f"signal {-code}").encode())
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
