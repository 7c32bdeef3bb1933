"""What a sandboxed interpreter runs first: `python -B -s -S sandbox_child.py CPU_S AS FSIZE NOFILE NPROC WALL_S
CONTAIN REPORT_FD PACKAGES`, CONTAIN 1 when it runs in its own namespaces (`enter_own_root` then runs first; 0:
the audit hook also confines reads), REPORT_FD a pipe for how the worker ended (-1: none), PACKAGES a JSON object:
`modules`, {top-level name: [its file, its package directories or null]} the code may import besides the standard
library (tools.sandbox.packages), and `trees`, the files and directories they are read from.

Standard library only: the interpreter starts without site-packages, so minirl is not importable, and nothing
outside the standard library is unless PACKAGES names it (`Packages`, a finder that knows only those names).

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
could otherwise reach out), reading another process's `/proc/<pid>`, and, without namespaces,
reading or listing anything outside the working directory, the standard library and PACKAGES' trees. A hook runs
inside the process it guards, so it stops mistakes and casual escapes, not a determined exploit of
CPython: in namespaces the run's own root and its lack of capabilities are the boundary.
"""

import contextlib
import errno
import importlib.util
import itertools
import json
import os
import posix
import re
import resource
import signal
import sys
import traceback
import types

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
# mount(2) and umount2(2) flags (linux/mount.h); a remount must repeat a mount's nosuid, nodev, noexec, atime flags
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH = 1, 2, 4, 32, 4096, 16384, 2
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
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # syscall numbers
# In namespaces the code's working directory, HOME and TMPDIR: the only writable place of its own root
CONTAINED_WORKDIR = "/sandbox"
# besides the standard library, what the interpreter may load: shared libraries (extension modules link
# against them) and the dynamic loader's cache; one that is a symlink here (merged /usr) is one there too
_SYSTEM_PATHS = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/etc/ld.so.cache")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEVICE_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
# prctl(2) options, the last capability number there may ever be, and capset(2)'s header version 3
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, CAP_LAST, CAPABILITY_VERSION_3 = 24, 38, 63, 0x20080522


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, the flags a remount must keep) of each mount this process sees."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            points.append((point, sum(_KEPT_MOUNT_FLAGS.get(option, 0) for option in fields[5].split(","))))
    return points


def _bound_paths(packages: list[str]) -> list[str]:
    """What the run's root holds of this machine, read-only: the directories of the standard library (the
    interpreter runs without site-packages), the system's shared libraries and the `packages` trees, each at its
    own path and never its parent's (a virtual environment may live in a home directory); a path under one
    already bound is left to it."""
    paths = sorted({os.path.abspath(p) for p in [*sys.path[1:], *_SYSTEM_PATHS, *packages] if os.path.lexists(p)})
    kept: list[str] = []
    for path in paths:
        if not any(path.startswith(k + os.sep) for k in kept):
            kept.append(path)
    return kept


class _Libc:
    """The few system calls that build the run's root, through ctypes (the audit hook is not installed yet)."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.pivot_root_number = _PIVOT_ROOT.get(os.uname().machine)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            error = self.ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    def mount(self, source: str | None, target: str, flags: int, fstype: str | None = None, data: bytes = b""):
        strings = [None if text is None else text.encode() for text in (source, target, fstype)]
        self.check(self.libc.mount(*strings, flags, data or None), f"mounting {source} on {target}")

    def pivot_root(self, new_root: str) -> None:
        """`new_root` becomes / and the old root is detached: nothing outside it can be reached by path."""
        if self.pivot_root_number is None:
            raise OSError(errno.ENOSYS, "pivot_root: no system call number known for this machine")
        os.chdir(new_root)
        self.check(self.libc.syscall(self.pivot_root_number, b".", b"."), "pivot_root")  # old root stacked on top
        self.check(self.libc.umount2(b".", MNT_DETACH), "detaching the old root")
        os.chdir("/")

    def drop_capabilities(self) -> None:
        """No capability left, none to regain by exec: the code cannot remount, unmount or mount anything."""
        for capability in range(CAP_LAST + 1):
            self.libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last one
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        header = (self.ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
        empty = (self.ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two 32-bit words each
        self.check(self.libc.capset(header, empty), "capset")


def enter_own_root(disk_bytes: int, packages: list[str]) -> None:
    """In the run's own user, mount and pid namespaces (the `unshare` the sandbox starts it under): pivot into
    a root of the run's own and drop every capability. That root is an empty tmpfs holding only the bound
    paths (`_bound_paths(packages)`, read-only), a few device nodes, this pid namespace's /proc (read-only), and the
    working directory `CONTAINED_WORKDIR`: a fresh tmpfs of `disk_bytes` holding a copy of `main.py`. The
    trainer's home, /tmp, /dev/shm, /run and every other file of the machine are absent, whatever the code
    does to the audit hook, and what it writes disappears with the namespace."""
    with open(SCRIPT, "rb") as f:
        code = f.read()
    calls = _Libc()
    root = os.path.realpath(os.getcwd())  # the run's directory on the host becomes the mount point of its root
    calls.mount("tmpfs", root, MS_NOSUID | MS_NODEV, "tmpfs", b"size=1m,mode=755")

    def inside(path: str) -> str:
        return root + path

    for path in _bound_paths(packages):
        if path in _SYSTEM_PATHS and os.path.islink(path):  # /lib -> usr/lib: bound as /usr/lib
            os.makedirs(os.path.dirname(inside(path)), exist_ok=True)
            os.symlink(os.readlink(path), inside(path))
            continue
        if os.path.isdir(path):
            os.makedirs(inside(path), exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside(path)), exist_ok=True)
            open(inside(path), "w").close()
        calls.mount(path, inside(path), MS_BIND | MS_REC)
    os.makedirs(inside("/dev"))
    for device in _DEVICES:
        open(inside(device), "w").close()
        calls.mount(device, inside(device), MS_BIND)
    for name, target in _DEVICE_LINKS.items():
        os.symlink(target, inside(f"/dev/{name}"))
    # no nested user namespace, which would hold capabilities again (over locked copies of these mounts: hardening)
    with contextlib.suppress(OSError), open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.makedirs(inside("/proc"))
    calls.mount("/proc", inside("/proc"), MS_BIND | MS_REC)  # unshare --mount-proc made it for this pid namespace
    os.makedirs(inside(CONTAINED_WORKDIR))
    workdir_options = f"size={disk_bytes},mode=700".encode()
    calls.mount("tmpfs", inside(CONTAINED_WORKDIR), MS_NOSUID | MS_NODEV, "tmpfs", workdir_options)
    writable = (inside(CONTAINED_WORKDIR), *map(inside, _DEVICES))
    for point, kept in _mount_points():
        if (point == root or point.startswith(root + os.sep)) and point not in writable:
            try:
                calls.mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
            except OSError as err:  # EINVAL: a mount hidden under another one, unreachable
                if err.errno != errno.EINVAL:
                    raise
    calls.pivot_root(root)
    calls.drop_capabilities()
    del calls  # and forget ctypes: the code's own `import ctypes` meets the audit hook, as without namespaces
    for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]
    os.chdir(CONTAINED_WORKDIR)
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


class Packages:
    """A meta path finder for the installed packages the code may import (PACKAGES' `modules`): a listed top-level
    name loads from where the trainer's interpreter found it, its submodules from its own directory as any
    package's do; any other name is not found here. Last on sys.meta_path: the standard library comes first."""

    def __init__(self, modules: dict[str, list]) -> None:
        self.modules = modules  # name -> [its file, its package directories or None]

    def find_spec(self, name: str, path=None, target=None):
        if path is not None or name not in self.modules:  # a submodule, or not listed
            return None
        origin, locations = self.modules[name]
        return importlib.util.spec_from_file_location(name, origin, submodule_search_locations=locations)


def _deny(what: str) -> None:
    raise PermissionError(f"{what} is not allowed in this sandbox")


class Guard:
    """The audit hook: `workdir` is the only tree the code may change. Given `readable` (without namespaces,
    where the machine's files are all there), the code may read only inside those trees, the working
    directory, the device nodes of `_DEVICES` and its own /proc/<pid>."""

    def __init__(self, workdir: str, readable: tuple[str, ...] | None = None) -> None:
        self.workdir = workdir
        self.pid = str(os.getpid())
        # the capture files behind stdout and stderr stay writable by name (/dev/stdout)
        self.writable = {"/dev/null", *(os.path.realpath(f"/proc/self/fd/{fd}") for fd in (1, 2))}
        self.readable = readable if readable is None else (*readable, workdir, f"/proc/{self.pid}")

    def _resolve(self, path, dir_fd) -> str | None:
        if isinstance(path, int):  # an open file descriptor: its open was checked
            return None
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd not in (None, -1) else os.getcwd()
        return os.path.realpath(os.path.join(base, os.fsdecode("." if path is None else path)))

    def _inside(self, real: str) -> bool:
        return real == self.workdir or real.startswith(self.workdir + os.sep) or real in self.writable

    def _check_read(self, real: str | None) -> None:
        if real is None or self.readable is None or real in self.writable or real in _DEVICES:
            return
        if not any(real == tree or real.startswith(tree + os.sep) for tree in self.readable):
            _deny(f"reading {real} (outside the working directory, the standard library and tools.sandbox.packages)")

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open":
            self._check_open(args[0], args[2])  # (path, mode, flags)
        elif event in ("os.listdir", "os.scandir"):
            self._check_read(self._resolve(args[0], None))
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
        self._check_read(real)


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


def _load_what_packages_import() -> None:
    """Before the audit hook, what packages import as they load that the hook would refuse. ctypes (sympy sizes a C
    long with it) loads as it is: the hook still refuses each of its events (loading a library, finding a symbol,
    memory at an address). _posixsubprocess (subprocess, which sympy imports, needs it; no audit event guards its
    fork_exec) is a module whose fork_exec refuses: subprocess imports, and no process is created through it."""
    import ctypes  # noqa: F401

    stand_in = types.ModuleType("_posixsubprocess")
    stand_in.fork_exec = lambda *args: _deny("creating a process")
    sys.modules["_posixsubprocess"] = stand_in


def _run_script() -> None:
    """`main.py` as `python main.py` runs it: in a fresh `__main__` module, with sys.argv == ['main.py'] (runpy would
    cost each run a few milliseconds of importing pkgutil and typing)."""
    main = types.ModuleType("__main__")
    main.__file__, main.__cached__ = SCRIPT, None
    sys.modules["__main__"] = main
    sys.argv[:] = [SCRIPT]
    with open(SCRIPT, "rb") as f:
        # bytes: a coding declaration is honoured; no __future__ flag of this file reaches the code
        code = compile(f.read(), SCRIPT, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # sandboxed: this worker already runs under the limits, the hook and its own root


def run_worker(limits: list[int], contained: bool, packages: dict) -> None:
    set_limits(*limits)
    readable = (*(os.path.realpath(p) for p in sys.path[1:]), *packages["trees"])  # no site-packages: -S
    sys.path[0] = os.getcwd()  # as for `python main.py`, not this file's directory
    if packages["modules"]:
        sys.meta_path.append(Packages(packages["modules"]))
        _load_what_packages_import()
    # no audit event covers these: they would reach other processes by pid or leave the process group
    for module, name in itertools.product((os, posix), ("pidfd_open", "setsid", "setpgid", "setpgrp")):
        module.__dict__.pop(name, None)
    signal.__dict__.pop("pidfd_send_signal", None)
    sys.addaudithook(Guard(os.path.realpath(os.getcwd()), readable=None if contained else readable))
    try:
        _run_script()
    except SystemExit:
        raise
    except BaseException as err:  # the model's own error: show it as Python would
        _print_traceback(err)
        sys.exit(1)


def main() -> None:
    *limits, wall_s, contain, report_fd = (int(arg) for arg in sys.argv[1:-1])
    packages = json.loads(sys.argv[-1])
    if contain:
        enter_own_root(disk_bytes=limits[2], packages=packages["trees"])  # a working directory as large as a file
    worker = os.fork()
    if worker == 0:
        if report_fd >= 0:
            os.close(report_fd)  # the code cannot write the report
        run_worker(limits, contained=bool(contain), packages=packages)
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
