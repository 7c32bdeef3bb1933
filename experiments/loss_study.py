"""Held-out success after a fixed RL budget for several losses and seeds, on the default task.

    python experiments/loss_study.py                      # run what is missing, then report
    python experiments/loss_study.py --losses grpo cispo --seeds 0 1 --steps 30

Each run is `python -m minirl.train loss=<loss> trainer.seed=<seed> trainer.steps=<steps>` with
everything else at its default (the cached warm start is shared); an algorithm preset such as dapo,
which sets `algo.*` too, runs as `experiment=<name>`. Runs whose metrics.jsonl is
complete are not repeated. Writes a markdown table (mean and spread over seeds of the held-out
success at every evaluation) and a PNG plot next to this script. Needs matplotlib
(`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONF = HERE.parent / "minirl" / "conf"


def run_dir(out: Path, loss: str, seed: int) -> Path:
    return out / f"{loss}-seed{seed}"


def evals(path: Path) -> dict[int, float]:
    """step -> held-out success rate, from one run's metrics.jsonl."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["eval/success_rate"] for row in rows if "eval/success_rate" in row}


def selection(loss: str) -> str:
    """The override that picks `loss`: a loss config, or an algorithm preset (minirl/conf/experiment/)."""
    return f"experiment={loss}" if (CONF / "experiment" / f"{loss}.yaml").exists() else f"loss={loss}"


def run(loss: str, seed: int, steps: int, eval_every: int, path: Path) -> None:
    if (path / "metrics.jsonl").exists() and steps in evals(path):
        return
    cmd = [
        sys.executable, "-m", "minirl.train", selection(loss), f"trainer.seed={seed}", f"trainer.steps={steps}",
        f"trainer.eval_every={eval_every}", "logger=none", "trainer.save_final=false", f"hydra.run.dir={path}",
    ]  # fmt: skip
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def report(results: dict[str, dict[int, dict[int, float]]], steps: int, title: str) -> str:
    """Markdown table: per loss, mean (min-max over seeds) at every evaluated step."""
    evaluated = sorted(next(iter(next(iter(results.values())).values())))
    lines = [
        "| loss | " + " | ".join(f"step {s}" for s in evaluated) + f" | gain at step {steps} |",
        "| --- |" + " --- |" * (len(evaluated) + 1),
    ]
    for loss, by_seed in results.items():
        cells = []
        for step in evaluated:
            values = [history[step] for history in by_seed.values()]
            cells.append(f"{statistics.fmean(values):.1%} ({min(values):.1%}-{max(values):.1%})")
        gains = [history[steps] - history[0] for history in by_seed.values()]
        cells.append(f"{statistics.fmean(gains):+.1%} (sd {statistics.pstdev(gains):.1%})")
        lines.append(f"| {loss} | " + " | ".join(cells) + " |")
    return f"{title}\n\n" + "\n".join(lines) + "\n"


def plot(results: dict[str, dict[int, dict[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for loss, by_seed in results.items():
        steps = sorted(next(iter(by_seed.values())))
        values = [[history[s] for history in by_seed.values()] for s in steps]
        mean = [statistics.fmean(v) for v in values]
        ax.plot(steps, mean, marker="o", label=loss)
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.15)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_title(f"mean and min-max over {len(next(iter(results.values())))} seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--losses", nargs="+", default=["grpo", "cispo", "gspo", "dapo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("outputs/loss_study"))
    args = parser.parse_args()
    results: dict[str, dict[int, dict[int, float]]] = {}
    for loss in args.losses:
        for seed in args.seeds:
            path = run_dir(args.out, loss, seed)
            run(loss, seed, args.steps, args.eval_every, path)
            results.setdefault(loss, {})[seed] = evals(path)
    title = f"Held-out success, {args.steps} RL steps, seeds {', '.join(map(str, args.seeds))}: mean (min-max)"
    table = report(results, args.steps, title)
    (HERE / "loss_study.md").write_text(table)
    plot(results, HERE / "loss_study.png")
    print(table)


if __name__ == "__main__":
    main()
