"""Throughput of the code_interpreter sandbox: calls per second at 1, 2 and 4 workers.

    python experiments/bench_sandbox.py [--calls 48]

Each setting runs one batch of calls through a ToolExecutor at once, as the calls of a turn are
run, for two programs: a bare print (the cost of a fresh contained process) and about 50 ms of
pure-Python CPU work. Prints a Markdown table; the numbers depend on the number of cores and on
whether this machine allows the sandbox's namespaces.
"""

from __future__ import annotations

import argparse
import os
import time

from minirl.config import SandboxConfig, ToolsConfig
from minirl.tools import ToolExecutor, build_tools, sandbox
from minirl.tools.base import ToolCall

PROGRAMS = {
    "print": "print(6 * 7)",
    "~50 ms CPU": "print(sum(i * i for i in range(1_000_000)))",
}
WORKERS = (1, 2, 4)


def calls_per_second(code: str, workers: int, calls: int) -> float:
    cfg = ToolsConfig(names=["code_interpreter"], timeout_s=120.0, sandbox=SandboxConfig(workers=workers))
    executor = ToolExecutor(build_tools(cfg.names, cfg), cfg.timeout_s, cfg.max_output_chars)
    batch = [ToolCall(f"call_{i}", "code_interpreter", {"code": code}) for i in range(calls)]
    executor.execute_many(batch[:workers])  # warm the page cache and the namespace probe
    started = time.perf_counter()
    results = executor.execute_many(batch)
    seconds = time.perf_counter() - started
    failed = [r.content for r in results if r.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} calls failed, e.g. {failed[0]}")
    return calls / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=48, help="calls per batch")
    args = parser.parse_args()
    isolation = "with namespaces" if sandbox.namespace_prefix() else "without namespaces (not allowed here)"
    print(f"{os.cpu_count()} CPUs, {isolation}, {args.calls} calls per batch; calls per second:\n")
    print("| program | " + " | ".join(f"{w} worker{'s' * (w > 1)}" for w in WORKERS) + " |")
    print("| --- |" + " --- |" * len(WORKERS))
    for program, code in PROGRAMS.items():
        rates = [calls_per_second(code, workers, args.calls) for workers in WORKERS]
        print(f"| {program} | " + " | ".join(f"{rate:.1f}" for rate in rates) + " |")


if __name__ == "__main__":
    main()
