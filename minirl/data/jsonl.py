"""Tasks from and rows to JSON-lines files (one row in MiniMind's agent-RL format per line)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from minirl.data.task import DataError, Task, task_from_row


def load_jsonl(path: str | os.PathLike) -> list[Task]:
    """Every task of the file; blank lines are skipped, a bad line raises DataError naming `path:lineno`."""
    tasks = []
    with open(path, encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg})") from None
            tasks.append(task_from_row(row, where))
    return tasks


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write one JSON row per line (UTF-8, parent folders created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
