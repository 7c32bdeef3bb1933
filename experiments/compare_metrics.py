"""Whether two runs logged the same metrics: line by line, every value equal (NaN equals NaN).

    python experiments/compare_metrics.py A/metrics.jsonl B/metrics.jsonl

Ignores what a rerun may change without changing the run: wall-clock keys (`time/*`, `tools/latency_*`,
under any prefix such as `eval/`) and bookkeeping fields (names starting with `_`, as W&B's `_runtime`,
`_timestamp`). Prints how many values it compared and each differing key with its step and both values;
exits 1 if anything differs (a key only one run has, or a different number of records).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

IGNORED_PREFIXES = ("time/", "tools/latency_")


def ignored(key: str) -> bool:
    """A wall-clock or bookkeeping key: `time/...` or `tools/latency_...` after any `prefix/`, or `_...`."""
    if key.startswith("_"):
        return True
    parts = key.split("/")
    return any("/".join(parts[i:]).startswith(IGNORED_PREFIXES) for i in range(len(parts)))


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(a: list[dict], b: list[dict]) -> tuple[int, list[str]]:
    """(values compared, one line per difference)."""
    compared, differences = 0, []
    if len(a) != len(b):
        differences.append(f"{len(a)} records against {len(b)}")
    for line, (left, right) in enumerate(zip(a, b), start=1):
        step = left.get("step", "?")
        for key in sorted((left.keys() | right.keys()) - {k for k in left.keys() | right.keys() if ignored(k)}):
            if key not in left or key not in right:
                differences.append(f"line {line} (step {step}): {key} only in {'A' if key in left else 'B'}")
                continue
            compared += 1
            if not same(left[key], right[key]):
                differences.append(f"line {line} (step {step}): {key}: {left[key]!r} != {right[key]!r}")
    return compared, differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the first run's metrics.jsonl")
    parser.add_argument("b", type=Path, help="the second run's metrics.jsonl")
    args = parser.parse_args()
    compared, differences = compare(records(args.a), records(args.b))
    print(f"{compared} values compared, {len(differences)} differences")
    for difference in differences:
        print(f"  {difference}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
