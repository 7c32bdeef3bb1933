"""Training-step time one step off (trainer.async_rollout) against the synchronous loop, by tool latency.

    python experiments/bench/async_overlap.py [--latency 0 0.1 0.3] [--steps 5] [--repeats 2]

Each point is a run of the default recipe (the warm-started tiny model, 14 prompts x 8 samples, MiniMind's
tools), --steps steps of `Trainer.train_step` with no evaluation, once synchronous and once with
experiment=async's settings, in alternation; every tool call first waits LATENCY seconds (a remote API's;
the wait takes no CPU). A step's time is the median of steps 2..--steps, then the median over --repeats. The
trainer is told of one step more than runs, so that the last timed step, one step off, also samples the next
step's rollout during its update, as every step of a longer run does (a run's real last step does not).
Synchronous, a step is its rollout plus its update; one step off, the update runs while the next rollout
does, so a step is bounded by the longer of the two, when they do not compete for the same cores. Prints a
table and writes async_overlap.json and async_overlap.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from rich.console import Console
from run import machine
from tool_latency import delayed

from minirl.bootstrap import model_path
from minirl.config import register_configs, to_config
from minirl.entry import CONF_DIR
from minirl.trainer import Trainer

HERE = Path(__file__).resolve().parent
SCHEDULES = {"synchronous": [], "one_step_off": ["experiment=async"]}


def step_seconds(schedule: str, latency: float, steps: int, scratch: Path) -> dict:
    """Median wall, rollout and update seconds of steps 2..steps of one run."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        overrides = [*SCHEDULES[schedule], f"trainer.steps={steps + 1}", "logger=none", "trainer.save_final=false"]
        cfg = to_config(compose("config", overrides=overrides))
    cfg.output_dir = str(scratch / f"{schedule}-{latency}")
    trainer = Trainer(cfg, model_path(cfg, Console(stderr=True)), Console(quiet=True))
    executor = trainer.sampler.executor
    executor.tools = {name: delayed(tool, latency) for name, tool in executor.tools.items()}
    rows = []
    for step in range(1, steps + 1):
        trainer.step = step
        started = time.perf_counter()
        metrics, _ = trainer.train_step()
        rows.append({**metrics, "wall_s": time.perf_counter() - started})
    if trainer.ahead is not None:
        trainer.ahead.close()
    keys = {"step_s": "wall_s", "rollout_s": "time/rollout_s", "update_s": "time/update_s"}
    return {name: statistics.median(row[key] for row in rows[1:]) for name, key in keys.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.1, 0.3])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    console = Console(width=120)
    register_configs()
    console.print("machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()))
    scratch = Path("outputs") / "bench-async"
    results = []
    for latency in args.latency:
        runs: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
        for repeat in range(args.repeats):
            for name in SCHEDULES if repeat % 2 == 0 else reversed(SCHEDULES):
                runs[name].append(step_seconds(name, latency, args.steps, scratch))
        row = {"latency_s": latency}
        for name, measured in runs.items():
            for key in measured[0]:
                row[f"{name}_{key}"] = statistics.median(m[key] for m in measured)
            row[f"{name}_step_s_runs"] = [m["step_s"] for m in measured]
        row["speedup"] = row["synchronous_step_s"] / row["one_step_off_step_s"]
        results.append(row)
        console.print(
            f"latency {latency:.2f} s: synchronous {row['synchronous_step_s']:.2f} s a step (rollout "
            f"{row['synchronous_rollout_s']:.2f} + update {row['synchronous_update_s']:.2f}), one step off "
            f"{row['one_step_off_step_s']:.2f} s (rollout {row['one_step_off_rollout_s']:.2f}, update "
            f"{row['one_step_off_update_s']:.2f}): {row['speedup']:.2f}x"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    setup = {"machine": machine(), "steps": args.steps, "repeats": args.repeats}
    (args.out / "async_overlap.json").write_text(json.dumps({**setup, "results": results}, indent=1) + "\n")
    plot(results, args.out / "async_overlap.png")
    console.print(f"wrote {args.out / 'async_overlap'}.json and .png")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    latency = [r["latency_s"] for r in results]
    for name, label in (("synchronous", "synchronous"), ("one_step_off", "one step off (experiment=async)")):
        ax.plot(latency, [r[f"{name}_step_s"] for r in results], "o-", label=label)
    ax.plot(latency, [max(r["synchronous_rollout_s"], r["synchronous_update_s"]) for r in results], "k:",
            label="max(rollout, update), synchronous")  # fmt: skip
    ax.set(xlabel="added wait per tool call (s)", ylabel="seconds per training step",
           title="default recipe: 14 prompts x 8 samples, MiniMind tools")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
