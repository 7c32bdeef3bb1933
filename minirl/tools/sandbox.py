"""Run untrusted Python code in a fresh, contained interpreter process (Linux).

    run = run_python("print(6 * 7)", limits, timeout_s=5.0)
    run.output, run.exit_code  # ('42\\n', 0)

Every run gets a new temporary directory, removed afterwards: `work/` (holding the code as `main.py`)
and the two files that capture stdout and stderr. The interpreter is `sys.executable -B -s -S` (no
site-packages: the standard library only, and the installed packages `tools.sandbox.packages` lists, each
with the packages it requires: `importable`), started in a new session with an environment built from
scratch, no stdin and no inherited descriptors. Containment, from the kernel inwards:

- namespaces, when this machine allows them unprivileged (`unshare --user --net --pid --mount-proc`,
  probed once): no network but a loopback that is down, no other process visible or reachable by pid,
  and when the run ends the kernel kills everything it started. The run pivots into a root of its own
  (`sandbox_child.enter_own_root`): an empty tmpfs with the standard library and the system's shared
  libraries bound read-only, a few device nodes, its own /proc, and the working directory
  `/sandbox` (also HOME and TMPDIR), a fresh tmpfs of `file_mb`; the listed packages' files are bound
  read-only like the standard library, each at its own path; the trainer's home, /tmp and every
  other file of the machine are not there at all. It then drops every capability, so nothing can be
  remounted, and (where the kernel lets it) no nested user namespace can be made;
- without namespaces, `code_interpreter` refuses to start unless `tools.sandbox.allow_unconfined`;
  then the audit hook alone keeps reads in the working directory, the standard library and the listed
  packages' files;
- resource limits the interpreter sets on itself before the code runs (`sandbox_child.py`): CPU
  seconds, address space, file size (stdout and stderr are files, so this bounds them on disk),
  open files, processes, no core dumps;
- a wall-clock deadline, after which the whole process group gets SIGKILL;
- an audit hook in the interpreter (`sandbox_child.py`) that refuses process creation, signals,
  sockets, ctypes and changes outside the working directory.

At most `4 * max_output_chars` bytes of each stream are ever read back into this process.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING

from minirl.tools.sandbox_child import CONTAINED_WORKDIR, SCRIPT

if TYPE_CHECKING:
    from minirl.config import SandboxConfig

CHILD = Path(__file__).with_name("sandbox_child.py")
_NAMESPACES = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")
_CUT_MARKER = "\n...[{stream} cut: {size} bytes in all]...\n"
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # the distribution a Requires-Dist line names


@dataclass
class SandboxRun:
    """How one run ended, and what it printed."""

    output: str  # stdout then stderr, each cut with a marker when too long
    exit_code: int  # 0: finished; 1: uncaught exception; 128 + N: killed by signal N (as a shell reads it)
    stderr_bytes: int
    timed_out: bool  # killed at the wall-clock deadline
    killed_by: int | None = None  # the signal that killed the interpreter; sys.exit(152) is no SIGXCPU


@functools.cache
def namespace_prefix() -> tuple[str, ...]:
    """`unshare` with the run's namespaces when it works here without privileges, the run's own root
    included (an empty run is the probe), else nothing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    command = (unshare, *_NAMESPACES)
    with tempfile.TemporaryDirectory(prefix="minirl-sandbox-probe-") as work:
        Path(work, SCRIPT).write_text("")
        # cpu_s, memory, file size, open files, processes, wall_s; a root of its own; no report pipe
        limits = (5, 256 << 20, 1 << 20, 64, 64, 10, 1, -1)
        try:
            probe = subprocess.run(
                [*command, *_interpreter(), *map(str, limits), json.dumps(importable(()))],
                cwd=work,
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ()
    return command if probe.returncode == 0 else ()


def _distribution_key(name: str) -> str:
    """A distribution's name as packaging normalises it (PEP 503): `Foo_Bar.baz` -> `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _installed() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(top-level name -> the distributions that install it, distribution key -> the top-level names it installs)."""
    installers = metadata.packages_distributions()
    provides = collections.defaultdict(list)
    for top, distributions in installers.items():
        for distribution in distributions:
            provides[_distribution_key(distribution)].append(top)
    return installers, provides


@functools.cache
def importable(names: tuple[str, ...]) -> dict:
    """What sandbox_child.py's PACKAGES says for the installed top-level packages `names` (tools.sandbox.packages)
    and, transitively, those their distributions require (extras left out; a requirement not installed here is
    left out too): `modules`, {name: [its file, its package directories or None]}, and `trees`, the real paths of
    each one's file or directories and of every other top-level entry its distribution installed (numpy.libs:
    the shared libraries numpy's extension modules load)."""
    modules, trees, todo = {}, set(), list(names)
    while todo:
        name = todo.pop()
        spec = None if name in modules else util.find_spec(name)
        if spec is None or not spec.has_location:  # done already, not installed, or built into the interpreter
            continue
        locations = [os.path.realpath(p) for p in spec.submodule_search_locations or []]
        modules[name] = [os.path.realpath(spec.origin), locations or None]
        trees.update(locations or [modules[name][0]])
        installers, provides = _installed()
        for distribution in map(metadata.distribution, installers.get(name, [])):
            tops = {file.parts[0] for file in distribution.files or []} - {"..", "__pycache__"}  # not bin/, not shared
            trees.update(os.path.realpath(distribution.locate_file(top)) for top in tops)
            for requirement in distribution.requires or []:
                if "extra" not in requirement.partition(";")[2]:
                    todo += provides[_distribution_key(_REQUIREMENT_NAME.match(requirement)[0])]
    return {"modules": modules, "trees": sorted(trees)}


def _interpreter() -> list[str]:
    """The sandboxed interpreter running sandbox_child.py, whose arguments come next."""
    return [sys.executable, "-B", "-s", "-S", str(CHILD)]


def _environment(home: str) -> dict[str, str]:
    """Built from scratch: nothing of this process's environment (tokens, keys, paths) reaches the code."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": "0",  # the same code prints sets and dicts in the same order
        "PYTHONUNBUFFERED": "1",  # what was printed before a kill is on disk
        "PYTHONIOENCODING": "utf-8:backslashreplace",
        # one thread per numerical library (numpy's OpenBLAS would start one per core, each eating address space)
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _command(limits: SandboxConfig, timeout_s: float, report_fd: int) -> list[str]:
    mb = 1 << 20
    rlimits = (limits.cpu_s, limits.memory_mb * mb, limits.file_mb * mb, limits.open_files, limits.processes)
    namespaces = namespace_prefix()
    # in namespaces the run gets a root of its own; the init reports how the worker ended on report_fd
    arguments = (*rlimits, math.ceil(timeout_s), int(bool(namespaces)), report_fd)
    return [*namespaces, *_interpreter(), *map(str, arguments), json.dumps(importable(tuple(limits.packages)))]


def _wait_then_kill(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether the run ended within `timeout_s`. Either way its process group is killed (whatever it
    left behind included) while the leader is still unreaped, so the group id cannot have been reused."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process exits
        finished = bool(poller.poll(math.ceil(max(0.0, timeout_s) * 1000)))
    finally:
        os.close(pidfd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return finished


def _read_capped(path: Path, max_chars: int, keep_end: bool) -> str:
    """The file as text, cut to `max_chars` characters (marker included) keeping its start or its end."""
    size = path.stat().st_size
    window = 4 * max_chars  # a UTF-8 character is at most 4 bytes
    with path.open("rb") as f:
        if keep_end:
            f.seek(max(0, size - window))
        text = f.read(window).decode("utf-8", errors="replace")
    if size <= window and len(text) <= max_chars:
        return text
    marker = _CUT_MARKER.format(stream=path.name, size=size)
    keep = max(0, max_chars - len(marker))
    return marker + text[len(text) - keep :] if keep_end else text[:keep] + marker


def _captured(stdout: Path, stderr: Path, max_chars: int) -> str:
    """stdout then stderr in `max_chars` characters. stderr keeps its end, where a traceback says what
    went wrong, in the room stdout leaves or at least half of it; stdout keeps its start."""
    err_room = max(max_chars // 2, max_chars - stdout.stat().st_size)
    err_text = _read_capped(stderr, err_room, keep_end=True)
    return _read_capped(stdout, max_chars - len(err_text), keep_end=False) + err_text


def run_python(code: str, limits: SandboxConfig, timeout_s: float) -> SandboxRun:
    """Run `code` as `main.py` in a fresh contained interpreter, killed after `timeout_s` seconds."""
    root = Path(tempfile.mkdtemp(prefix="minirl-sandbox-"))
    try:
        work, stdout, stderr = root / "work", root / "stdout", root / "stderr"
        work.mkdir()
        (work / SCRIPT).write_text(code, encoding="utf-8", errors="replace")
        report, report_end = os.pipe()  # the interpreter's init writes "exit N" or "signal N" before it exits
        try:
            with stdout.open("wb") as out, stderr.open("wb") as err:
                proc = subprocess.Popen(
                    _command(limits, timeout_s, report_end),
                    cwd=work,
                    env=_environment(CONTAINED_WORKDIR if namespace_prefix() else str(work)),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    pass_fds=(report_end,),
                )
        finally:
            os.close(report_end)
        timed_out = not _wait_then_kill(proc, timeout_s)
        with os.fdopen(report, "rb") as f:
            how, _, number = f.read(64).decode("ascii", errors="replace").partition(" ")
        if how in ("exit", "signal") and number.isdigit():
            exit_code, killed_by = (int(number), None) if how == "exit" else (128 + int(number), int(number))
        else:  # the init itself was killed (at the deadline)
            killed_by = -proc.returncode if proc.returncode < 0 else None
            exit_code = proc.returncode if killed_by is None else 128 + killed_by
        return SandboxRun(
            output=_captured(stdout, stderr, limits.max_output_chars),
            exit_code=exit_code,
            stderr_bytes=stderr.stat().st_size,
            timed_out=timed_out,
            killed_by=killed_by,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
