"""The run directory's JSON-lines files: `trajectories.jsonl` (written here, one record per line, see
`minirl.inspection.record`), `metrics.jsonl` (one row per `Tracker.log` call) and `heldout.jsonl` (one row per
held-out evaluation: {"step": N, "tasks": [task id, ...], "solved": [0 or 1, ...]}, in held-out task order, which
pairs two runs' evaluations task by task), read back tolerantly.

A run that crashed, or is still writing, may end in a partial line: readers skip it, and the next
`write_trajectories` cuts it off before appending.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from minirl.inspection.record import trajectory_record

if TYPE_CHECKING:
    from minirl.rewards import SuccessCriterion
    from minirl.rollout.trajectory import Trajectory

TRAJECTORIES_FILE = "trajectories.jsonl"
METRICS_FILE = "metrics.jsonl"
HELDOUT_FILE = "heldout.jsonl"
RUN_FILES = (METRICS_FILE, TRAJECTORIES_FILE, HELDOUT_FILE)  # what a resumed run cuts back to its checkpoint
_BLOCK = 1 << 16


class RunFileError(ValueError):
    """A run file is missing or holds a line that is not a JSON object; the message names file and line."""


def _drop_partial_line(path: Path) -> None:
    """Cut a last line that has no newline (a write interrupted by a crash), so appends start a line."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        position = f.seek(0, os.SEEK_END)
        while position > 0:
            start = max(0, position - _BLOCK)
            f.seek(start)
            newline = f.read(position - start).rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)  # the file's own size when it ends with a newline
                return
            position = start
        f.truncate(0)


def write_trajectories(
    path: str | Path,
    step: int,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    tokenizer,
    limit: int | None = None,
    solved: SuccessCriterion | None = None,
) -> list[dict]:
    """Append a record per trajectory to `path` (a `trajectories.jsonl`) and return the records written
    (for `trajectory_table`).

    advantages: one float per trajectory (e.g. the [N] advantage tensor's `.tolist()`). `limit` keeps the
    first `limit` trajectories (groups are contiguous, so whole groups come first). `solved` is the run's
    success criterion (`reward.success`), recorded as each record's `success`.
    """
    if len(advantages) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages; need one per trajectory")
    chosen = list(zip(trajectories, advantages))[:limit]
    records = [trajectory_record(traj, step, advantage, tokenizer, solved) for traj, advantage in chosen]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(path)
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    return records


def keep_through_step(path: Path, step: int) -> None:
    """Rewrite a run file keeping only its complete rows with "step" <= `step` (resuming from that step's
    checkpoint: later rows are logged again; -1 keeps none). A missing file stays missing."""
    if not path.exists():
        return
    _drop_partial_line(path)
    kept = [row for row in read_jsonl(path) if row.get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept), encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """The JSON objects of a JSON-lines file, in order; a partial last line is skipped, any other line that
    is not a JSON object raises RunFileError naming `path:line`."""
    path = Path(path)
    if not path.is_file():
        raise RunFileError(f"{path} does not exist")
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith(b"\n"):
                    return  # cut off mid-write
                raise RunFileError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise RunFileError(f"{path}:{number}: not a JSON object")
            yield row


def read_trajectories(path: str | Path) -> Iterator[dict]:
    """The records of a `trajectories.jsonl`, in the order they were written."""
    return read_jsonl(path)


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a `metrics.jsonl`: {"step": N, "<metric>": value, ...} per `Tracker.log` call."""
    return list(read_jsonl(path))


def select_records(records: Sequence[dict], steps: Sequence[int] | None, limit: int | None) -> list[dict]:
    """The records of `steps` (None: the latest step recorded), at most `limit` per step, in file order.
    Raises RunFileError when there are no records or a step has none."""
    recorded = sorted({r["step"] for r in records})
    if not recorded:
        raise RunFileError("no trajectories recorded yet")
    wanted = list(steps) if steps else recorded[-1:]
    missing = [s for s in wanted if s not in recorded]
    if missing:
        listing = ", ".join(map(str, recorded))
        raise RunFileError(f"no trajectories at step {', '.join(map(str, missing))}; recorded steps: {listing}")
    chosen = []
    for step in wanted:
        chosen += [r for r in records if r["step"] == step][:limit]
    return chosen
