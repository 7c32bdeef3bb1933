"""Multi-turn rollouts with the real tools: a MiniMind-style loop against minirl's engines and schedules.

    python experiments/bench/agent_rollout.py [--preset default retool] [--prompts 14] [--repeats 3]
        [--temperature 0] [--set KEY=VALUE ...]

One rollout is what a training step of the preset samples: --prompts of its training tasks x rollout.group_size
samples, through the agent loop, with the preset's tools and turn budgets, on its warm-started tiny model (built
and cached on first use, as `python -m minirl.train` builds it). `default`: MiniMind's six mock tools (JSON
calls), up to 3 turns; `retool` (experiment=retool): the Python interpreter in the sandbox. Four ways to run it:

- one at a time (MiniMind-style): each trajectory alone, each turn one `model.generate` over the whole
  conversation so far (minirl's `hf` engine on a batch of one), its calls run before the next trajectory starts;
- hf, batched: every live trajectory's turn in one `model.generate` call (round barrier), then all their calls;
- torch, barrier: minirl's torch engine (rows leave the batch when they end; a turn encodes only what was
  appended since the last one), then all the turn's calls, tools.max_concurrent_calls at once;
- torch, no barrier: the same engine with rollout.barrier=false: a trajectory's calls run while the others
  decode, and its next turn joins the running batch.

Decoding is greedy by default, so that every way writes the same trajectories (checked: calls and sampled tokens are
printed for each); greedy, a group's samples are all alike, which the torch engine's prefill of each distinct prompt
once favours. `--temperature 1` samples as training does (from seed r in repeat r): the ways then draw different
trajectories, of about the same number of calls and tokens (printed). Each rollout's seconds are wall time; the
ways alternate in order from one repeat to the next, after a warm-up rollout of two prompts each; medians of
--repeats. Also per way: prefill tokens per trajectory (tokens encoded by forward calls that feed more than one
token a row, padding excluded), the calls' summed time (tool busy) and the wall time during which at least one
call ran (tool active). Prints a table and writes agent_rollout.json and .png (agent_rollout_temperature_T.json
and .png when sampled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from rich.console import Console
from rich.table import Table
from turns import PrefillCounter

from minirl.bootstrap import model_path
from minirl.config import register_configs, to_config
from minirl.data import DATASETS
from minirl.entry import CONF_DIR
from minirl.models.loading import load_model, load_tokenizer
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.tools import ToolExecutor

HERE = Path(__file__).resolve().parent
PRESETS = {"default": [], "retool": ["experiment=retool"]}
WAYS = {  # name: (engine, barrier, one trajectory at a time)
    "one at a time (MiniMind-style)": ("hf", True, True),
    "hf generate, batched": ("hf", True, False),
    "torch, barrier": ("torch", True, False),
    "torch, no barrier": ("torch", False, False),
}


class CallClock:
    """Wraps every tool of `executor` to record each call's (start, end) wall clock, from any thread."""

    def __init__(self, executor: ToolExecutor) -> None:
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        for tool in executor.tools.values():
            tool.run = self._timed(tool.run)

    def _timed(self, run):
        def timed_run(arguments: dict) -> dict:
            started = time.perf_counter()
            try:
                return run(arguments)
            finally:
                with self._lock:
                    self.spans.append((started, time.perf_counter()))

        return timed_run

    def busy(self) -> float:
        """The calls' durations summed (s)."""
        return sum(end - start for start, end in self.spans)

    def active(self) -> float:
        """Wall seconds during which at least one call ran: the union of the spans."""
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


class PresetRollouts:
    """A preset's model, engines, tools and training tasks, loaded once, and one rollout of them each way."""

    def __init__(self, preset: str, overrides: list[str], prompts: int, temperature: float) -> None:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            self.cfg = to_config(compose("config", overrides=PRESETS[preset] + overrides))
        path = model_path(self.cfg, Console(stderr=True))
        self.tokenizer = load_tokenizer(path, self.cfg)
        model = load_model(path, self.cfg, torch.device("cpu"), trainable=False)
        self.counter = PrefillCounter(model)
        self.engines = {name: ENGINES.get(name)(model, self.tokenizer, torch.device("cpu")) for name in ("hf", "torch")}
        self.executor = ToolExecutor.from_config(self.cfg.tools)
        self.clock = CallClock(self.executor)
        self.tasks = DATASETS.get(self.cfg.data.name)(self.cfg.data).train[:prompts]
        self.sampling = SamplingParams.from_config(self.cfg.rollout, temperature)

    def rollout(self, way: str, prompts: int, seed: int) -> dict:
        """One rollout of the first `prompts` tasks x group size the `way` runs it: its seconds, work and tool time."""
        engine, barrier, alone = WAYS[way]
        group_size, limits = self.cfg.rollout.group_size, AgentLimits.from_config(self.cfg.rollout)

        def run(tasks, group_size):
            return run_agent(self.engines[engine], self.tokenizer, self.executor, tasks, group_size, limits,
                             self.sampling, self.cfg.protocol, barrier=barrier)  # fmt: skip

        self.engines["torch"].free_memory()  # no keys and values kept from another way's rollout
        torch.manual_seed(seed)
        self.clock.spans, self.counter.tokens = [], 0
        started = time.perf_counter()
        tasks = self.tasks[:prompts]
        if alone:
            trajectories = [t for task in tasks for _ in range(group_size) for t in run([task], 1)]
        else:
            trajectories = run(tasks, group_size)
        seconds = time.perf_counter() - started
        return {
            "seconds": seconds,
            "trajectories": len(trajectories),
            "calls": sum(len(turn.tool_results) for t in trajectories for turn in t.turns),
            "sampled_tokens": sum(sum(t.action_mask) for t in trajectories),
            "prefill_tokens_per_trajectory": self.counter.tokens / len(trajectories),
            "tool_busy_s": self.clock.busy(),
            "tool_active_s": self.clock.active(),
        }


def bench_preset(
    preset: str, overrides: list[str], prompts: int, repeats: int, temperature: float, console: Console
) -> dict:
    bench = PresetRollouts(preset, overrides, prompts, temperature)
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for way in WAYS:  # warm-up: kernels, the sandbox's workers
        bench.rollout(way, 2, seed=0)
    for repeat in range(repeats):
        for way in WAYS if repeat % 2 == 0 else reversed(WAYS):
            runs[way].append(bench.rollout(way, prompts, seed=repeat))
            console.print(f"{preset}, {way}: {runs[way][-1]['seconds']:.2f} s", style="dim")
    results = {}
    for way, measured in runs.items():
        median = {key: statistics.median(run[key] for run in measured) for key in measured[0]}
        results[way] = median | {"runs_s": [run["seconds"] for run in measured]}
    setup = {
        "overrides": PRESETS[preset] + overrides,
        "temperature": temperature,
        "prompts": prompts,
        "group_size": bench.cfg.rollout.group_size,
        "max_turns": bench.cfg.rollout.max_turns,
        "max_new_tokens": bench.cfg.rollout.max_new_tokens,
        "tools": sorted(bench.executor.tools),
        "max_concurrent_calls": bench.cfg.tools.max_concurrent_calls,
    }
    return {"setup": setup, "results": results}


def print_table(preset: str, measured: dict, console: Console) -> None:
    setup, results = measured["setup"], measured["results"]
    baseline = results["one at a time (MiniMind-style)"]["seconds"]
    table = Table(title=f"{preset}: {setup['prompts']} prompts x {setup['group_size']} ({decoding(setup)}), "
                        f"up to {setup['max_turns']} turns, tools {', '.join(setup['tools'])}")  # fmt: skip
    for column in ("way", "rollout", "speed-up", "prefill tokens / traj", "calls", "sampled tokens",
                   "tool busy", "tool active"):  # fmt: skip
        table.add_column(column)
    for way, r in results.items():
        table.add_row(
            way, f"{r['seconds']:.2f} s", f"{baseline / r['seconds']:.1f}x",
            f"{r['prefill_tokens_per_trajectory']:.0f}", f"{r['calls']:.0f}", f"{r['sampled_tokens']:.0f}",
            f"{r['tool_busy_s']:.3f} s", f"{r['tool_active_s']:.3f} s",
        )  # fmt: skip
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", choices=sorted(PRESETS), default=list(PRESETS))
    parser.add_argument("--prompts", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (every way the same trajectories)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every preset")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    console = Console(width=140)
    register_configs()
    measured = {}
    for preset in args.preset:
        measured[preset] = bench_preset(preset, args.set, args.prompts, args.repeats, args.temperature, console)
        print_table(preset, measured[preset], console)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "agent_rollout" + (f"_temperature_{args.temperature:g}" if args.temperature else "")
    (args.out / f"{name}.json").write_text(json.dumps(measured, indent=1) + "\n")
    plot(measured, args.out / f"{name}.png")
    console.print(f"wrote {args.out / name}.json and .png")


def decoding(setup: dict) -> str:
    return f"temperature {setup['temperature']:g}" if setup["temperature"] else "greedy"


def plot(measured: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(measured), figsize=(6 * len(measured), 4), squeeze=False)
    for ax, (preset, m) in zip(axes[0], measured.items()):
        ways = list(m["results"])
        seconds = [m["results"][way]["seconds"] for way in ways]
        active = [m["results"][way]["tool_active_s"] for way in ways]
        y = range(len(ways))
        ax.barh(y, seconds, label="rollout (wall)")
        ax.barh(y, active, height=0.4, label="some tool call running (wall)")
        for row, value in zip(y, seconds):
            ax.annotate(f"{value:.2f} s", (value, row), xytext=(3, 0), textcoords="offset points", va="center")
        ax.set_yticks(list(y), ways)
        ax.invert_yaxis()
        ax.set_xlim(0, max(seconds) * 1.2)
        ax.set(xlabel="seconds per rollout", title=f"{preset}: {m['setup']['prompts']} prompts x "
                                                     f"{m['setup']['group_size']}, {decoding(m['setup'])}")  # fmt: skip
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
