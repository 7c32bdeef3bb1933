"""Step time against group size and trajectory length, on the bench's single-turn work (workload.py).

    python experiments/bench/scaling.py [--groups 2 4 8 16] [--tokens 32 64 128] [--repeats 3]

Each point is `python -m minirl.train` runs of 4 steps with workload.py's settings but one knob changed
(rollout.group_size, or rollout.max_new_tokens); a run's rollout and update seconds are medians of steps 2-4,
and a point's the median of --repeats runs, each repeat sweeping every point once (so that a slower spell of
the machine spreads over the points rather than falling on one). The
random-weight model rarely samples its end-of-turn token, so a trajectory is about max_new_tokens long. Writes
scaling.json and scaling.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import workload
from rich.console import Console

HERE = Path(__file__).resolve().parent
MODEL_DIR = Path("~/.cache/minirl/bench-qwen2-6m").expanduser()


def step_times(scratch: Path, name: str, overrides: list[str]) -> dict:
    """Median rollout and update seconds of steps 2-4 of one run with `overrides` on top of the work's."""
    run_dir = scratch / name
    args = [*workload.minirl_overrides(MODEL_DIR, scratch / "tasks.jsonl", run_dir), "trainer.steps=4", *overrides]
    done = subprocess.run([sys.executable, "-m", "minirl.train", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [row for row in rows if "time/step_s" in row][1:]
    times = {key: statistics.median(row[f"time/{key}_s"] for row in timed) for key in ("rollout", "update")}
    return {**times, "tokens": statistics.median(row["rollout/sampled_tokens"] for row in timed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    console = Console(width=120)
    workload.build_model(MODEL_DIR)
    curves: dict[str, list[dict]] = {"group_size": [], "max_new_tokens": []}
    points = [
        *(("group_size", g, [f"rollout.group_size={g}", f"trainer.micro_batch_size={workload.PROMPTS * g}"])
          for g in args.groups),
        *(("max_new_tokens", t, [f"rollout.max_new_tokens={t}"]) for t in args.tokens),
    ]  # fmt: skip
    runs: dict[tuple[str, int], list[dict]] = {(knob, value): [] for knob, value, _ in points}
    with tempfile.TemporaryDirectory() as scratch:
        workload.write_tasks(Path(scratch) / "tasks.jsonl")
        for repeat in range(args.repeats):
            for knob, value, overrides in points:
                runs[knob, value].append(step_times(Path(scratch), f"{knob}-{value}-{repeat}", overrides))
    for (knob, value), measured in runs.items():
        point = {key: statistics.median(run[key] for run in measured) for key in measured[0]}
        curves[knob].append({"value": value, **point})
        console.print(f"{knob} {value}: {point}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(curves, indent=1) + "\n")
    plot(curves, args.out / "scaling.png")
    console.print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(10, 4))
    labels = {"group_size": f"group size ({workload.PROMPTS} prompts)", "max_new_tokens": "max new tokens (one turn)"}
    for ax, (knob, points) in zip(axes, curves.items()):
        x = [p["value"] for p in points]
        for part in ("rollout", "update"):
            ax.plot(x, [p[part] for p in points], "o-", label=part)
        ax.set(xlabel=labels[knob], ylabel="seconds per step", xticks=x)
        ax.legend()
    fig.suptitle("minirl's step on the bench's 6.4M model, 2-core CPU: both parts grow with the tokens sampled")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
