"""Tasks from and rows to JSON-lines files (one row in MiniMind's agent-RL format per line)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from minirl.data.task import Task, task_from_row
from minirl.errors import DataError

_BOM = b"\xef\xbb\xbf"  # some editors start a UTF-8 file with it; JSON does not allow it
_DRAIN_BYTES = 1 << 20  # the rest of an over-long line is read and dropped this much at a time


def _lines(stream: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, line without its line break, its length in bytes) per line; a line over
    `max_bytes` comes back as None, read in chunks and never held whole. A leading BOM is dropped."""
    lineno = 0
    while chunk := stream.readline(max_bytes + 2):  # room for "\r\n"
        lineno += 1
        line = (chunk.removeprefix(_BOM) if lineno == 1 else chunk).rstrip(b"\r\n")
        if len(line) <= max_bytes:
            yield lineno, line, len(line)
            continue
        size = len(line)
        while not chunk.endswith(b"\n") and (chunk := stream.readline(_DRAIN_BYTES)):
            size += len(chunk.rstrip(b"\r\n"))
        yield lineno, None, size


def _row(line: bytes | None, size: int, max_bytes: int) -> Any:
    """The JSON row one line holds; DataError says why it holds none."""
    if line is None:
        raise DataError(f"the line has {size} bytes, more than data.max_row_bytes={max_bytes}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"not valid UTF-8 (byte {line[err.start]:#04x} at byte offset {err.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"not valid JSON ({err.msg} at column {err.colno}); expected one JSON object") from None
    except RecursionError:
        raise DataError("not valid JSON (nested too deeply)") from None
    except ValueError as err:  # e.g. an integer with more digits than Python converts
        raise DataError(f"not valid JSON ({err})") from None


def _task(line: bytes | None, size: int, max_bytes: int, where: str) -> Task:
    try:
        row = _row(line, size, max_bytes)
    except DataError as err:
        raise DataError(f"{where}: {err}") from None
    return task_from_row(row, where)


def load_jsonl(path: str | os.PathLike, max_row_bytes: int, skipped: list[str] | None = None) -> list[Task]:
    """Every task of the file; blank lines are passed over. A bad line raises DataError naming
    `path:lineno`, or, given a `skipped` list, is appended to it as `path:lineno: reason` while
    every good line is kept. A file without a single task, or one that cannot be read, raises DataError
    either way."""
    tasks: list[Task] = []
    bad: list[str] = []
    try:
        with open(path, "rb") as stream:
            for lineno, line, size in _lines(stream, max_row_bytes):
                if line is not None and not line.strip():
                    continue
                try:
                    tasks.append(_task(line, size, max_row_bytes, f"{path}:{lineno}"))
                except DataError as err:
                    if skipped is None:
                        raise
                    bad.append(str(err))
    except OSError as err:  # missing, a directory, unreadable
        raise DataError(f"{path}: cannot read it ({err.strerror})") from None
    if not tasks:
        why = f"all {len(bad)} rows are malformed; the first: {bad[0]}" if bad else "no rows"
        raise DataError(f"{path}: {why}")
    if skipped is not None:
        skipped += bad
    return tasks


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write one JSON row per line (UTF-8, parent folders created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
