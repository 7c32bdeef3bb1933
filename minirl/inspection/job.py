"""A run directory's job record, `job.json`: what ran there and how it went. The entry point writes it for every
command (minirl/sweep.py); the sweep report (`python -m minirl.report`) and a rerun of the sweep read it.

    {"status": "finished", "command": "train", "overrides": ["loss=cispo", "trainer.seed=1"],
     "swept": ["loss", "trainer.seed"], "job_num": 3, "attempts": 1, "host": "box", "pid": 4242, "threads": 2,
     "cpu_capability": "AVX512", "first_started": 1764670000.0, "started": 1764670000.0, "ended": 1764670183.2,
     "wall_s": 183.2, "objective": 0.469, "error": null}

`overrides` are the job's own (Hydra's task overrides), the ones that made what the directory holds: a rerun
checks them before it skips or resumes the job. `first_started` is when its first attempt started (the report
lists runs in that order), `started` its last's; `wall_s` is the job's last attempt, from the start of the
command to its end (a model build and the held-out evaluations included). `threads` and `cpu_capability` (the
vector instructions torch's kernels use on this CPU: AVX2, AVX512, ...) set a run's float rounding: a seed repeats
its run bit for bit where both are the same, and may part from it in the last bits where either differs. `error`
is the failure's last line, `traceback` the whole of it.
"""

from __future__ import annotations

import json
import os
import socket
from enum import Enum
from pathlib import Path

JOB_FILE = "job.json"


class JobStatus(str, Enum):
    running = "running"
    finished = "finished"
    failed = "failed"  # the command raised: `error` says what
    interrupted = "interrupted"  # stopped from outside (Ctrl-C, kill -9, a node lost) before it ended


def read_job(run_dir: str | Path) -> dict | None:
    """The job record of `run_dir`; None when there is none, or it is not a JSON object (a write cut off)."""
    path = Path(run_dir) / JOB_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def write_job(run_dir: str | Path, record: dict) -> None:
    """Replace `run_dir`'s job record at once (a reader never sees half of it)."""
    path = Path(run_dir) / JOB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{JOB_FILE}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def job_status(record: dict) -> JobStatus:
    """The record's status, where a job that says it is running on this host but whose process is gone was
    interrupted (kill -9 leaves no chance to say so). On another host (a cluster node) running is believed."""
    try:
        status = JobStatus(record.get("status"))
    except ValueError:  # a record cut off or written by hand
        return JobStatus.interrupted
    if status is JobStatus.running and record.get("host") == socket.gethostname() and not _alive(record["pid"]):
        return JobStatus.interrupted
    return status
