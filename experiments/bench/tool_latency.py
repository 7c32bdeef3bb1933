"""Rollout time against tool latency, with and without the round barrier (rollout.barrier).

    python experiments/bench/tool_latency.py [--prompts 14] [--latency 0 0.05 0.2 0.5] [--max-concurrent N]

One rollout is what a default training step samples: `--prompts` training tasks x rollout.group_size samples,
up to 3 turns, on the warm-started tiny model (built and cached on first use) with MiniMind's tools, each call
held back by an added wait of LATENCY seconds (a remote API's; the wait takes no CPU). Both schedules run
in alternation; medians of --repeats after a warm-up. Decoding is greedy: sampled, the two schedules would
draw different trajectories from one seed (without the barrier each trajectory has a generator of its own),
with other calls and lengths; greedy, they produce the very same ones (tests/test_no_barrier.py), so the table
compares the schedules on equal work. Prints a table and writes tool_latency.json and tool_latency.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from rich.console import Console

from minirl.bootstrap import model_path
from minirl.config import register_configs, to_config
from minirl.data import DATASETS
from minirl.entry import CONF_DIR
from minirl.models.loading import load_model, load_tokenizer
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.tools import ToolExecutor

HERE = Path(__file__).resolve().parent


def delayed(tool, seconds: float):
    """`tool` whose every call first waits `seconds` (sleeping, not computing)."""
    run = tool.run

    def slow_run(arguments: dict) -> dict:
        time.sleep(seconds)
        return run(arguments)

    tool.run = slow_run
    return tool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=14)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.05, 0.2, 0.5])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-concurrent", type=int, default=0, help="tools.max_concurrent_calls (0: the default)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    console = Console(width=120)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        overrides = [f"tools.max_concurrent_calls={args.max_concurrent}"] if args.max_concurrent else []
        cfg = to_config(compose("config", overrides=overrides))
    path = model_path(cfg, Console(stderr=True))
    tokenizer, model = load_tokenizer(path, cfg), load_model(path, cfg, torch.device("cpu"), trainable=False)
    tasks = DATASETS.get(cfg.data.name)(cfg.data).train[: args.prompts]
    r = cfg.rollout
    limits = AgentLimits.from_config(r)
    sampling = SamplingParams.from_config(r, 0.0)  # greedy: the same trajectories under both schedules
    engine = ENGINES.get("torch")(model, tokenizer, torch.device("cpu"))
    results = []
    for latency in args.latency:
        executor = ToolExecutor.from_config(cfg.tools)
        executor.tools = {name: delayed(tool, latency) for name, tool in executor.tools.items()}
        seconds: dict[bool, list[float]] = {True: [], False: []}
        work: dict[bool, tuple[int, int]] = {}  # (calls, sampled tokens) of each schedule's last run
        for repeat in range(args.repeats + 1):
            for barrier in (True, False) if repeat % 2 else (False, True):
                torch.manual_seed(repeat)
                started = time.perf_counter()
                trajs = run_agent(engine, tokenizer, executor, tasks, r.group_size, limits, sampling, cfg.protocol,
                                  barrier=barrier)  # fmt: skip
                if repeat:  # the first of each warms up
                    seconds[barrier].append(time.perf_counter() - started)
                    work[barrier] = (
                        sum(len(u.tool_results) for t in trajs for u in t.turns),
                        sum(sum(t.action_mask) for t in trajs),
                    )
        if work[True] != work[False]:
            raise RuntimeError(f"the schedules did different work (calls, sampled tokens): {work}")
        calls, tokens = work[True]
        row = {"latency_s": latency, "calls": calls, "sampled_tokens": tokens}
        row |= {("barrier_s" if b else "no_barrier_s"): statistics.median(s) for b, s in seconds.items()}
        results.append(row)
        console.print(
            f"latency {latency:.2f} s: barrier {row['barrier_s']:.2f} s, none {row['no_barrier_s']:.2f} s "
            f"({row['no_barrier_s'] / row['barrier_s']:.2f}x), {calls} calls and {tokens} sampled tokens in both"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    setup = {
        "prompts": args.prompts,
        "group_size": r.group_size,
        "max_concurrent_calls": cfg.tools.max_concurrent_calls,
    }
    name = "tool_latency" + (f"_{args.max_concurrent}_at_once" if args.max_concurrent else "")
    (args.out / f"{name}.json").write_text(json.dumps({**setup, "results": results}, indent=1) + "\n")
    plot(results, setup, args.out / f"{name}.png")
    console.print(f"wrote {args.out / name}.json and .png")


def plot(results: list[dict], setup: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    latency = [r["latency_s"] for r in results]
    ax.plot(latency, [r["barrier_s"] for r in results], "o-", label="round barrier (rollout.barrier=true)")
    ax.plot(latency, [r["no_barrier_s"] for r in results], "o-", label="no barrier (rollout.barrier=false)")
    ax.set(xlabel="added wait per tool call (s)", ylabel="seconds per rollout",
           title=f"{setup['prompts']} prompts x {setup['group_size']} (greedy), MiniMind tools, "
                 f"{setup['max_concurrent_calls']} calls at once")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
