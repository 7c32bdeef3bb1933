"""Fault drill: a short training run of the embedded tiny model in which things break on purpose, to
check that each fault is survived and counted in metrics.jsonl.

    python experiments/fault_drill.py [--steps 8] [--out outputs/fault_drill] [--model PATH]

- a tool that raises: `get_current_time` raises RuntimeError on every call -> tools/error_count
- a tool that hangs: `unit_converter` sleeps past tools.timeout_s (0.5 s here) -> tools/timeout_count
- a forced NaN loss at step 3 (trainer.nan_loss_steps) -> faults/skipped_updates
- ten malformed rows in the jsonl dataset (data.on_error=skip) -> data/skipped_rows at step 0

The two tools are swapped into the trainer's tool executor after it is built; everything else is the
default configuration. Prints the total of each fault counter over the run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from rich.console import Console

from minirl.bootstrap import model_path
from minirl.config import register_configs, to_config
from minirl.data.synthetic_tools import GENERATOR
from minirl.entry import CONF_DIR
from minirl.tools.minimind import GetCurrentTime, UnitConverter
from minirl.trainer import Trainer

MALFORMED_ROWS = [
    "{not json",
    "[1, 2, 3]",
    '{"gt": ["1"]}',
    '{"conversations": "hello", "gt": []}',
    '{"conversations": [{"role": "wizard", "content": "hi"}], "gt": []}',
    '{"conversations": [{"role": "user", "content": 42}], "gt": []}',
    '{"conversations": [{"role": "system", "content": "s", "tools": {"name": "x"}}, '
    '{"role": "user", "content": "q"}], "gt": []}',
    '{"conversations": [{"role": "user", "content": "q"}], "gt": "not a list"}',
    '{"conversations": [{"role": "user", "content": "q"}], "gt": [], "kind": 7}',
    '{"conversations": [{"role": "user", "content": "' + "x" * 2_000_000 + '"}], "gt": []}',
]


class RaisingTime(GetCurrentTime):
    calls = 0  # how often the fault fired, to check against the metrics

    def run(self, arguments: dict) -> dict:
        RaisingTime.calls += 1
        raise RuntimeError("clock service unavailable (fault drill)")


class HangingConverter(UnitConverter):
    calls = 0

    def run(self, arguments: dict) -> dict:
        HangingConverter.calls += 1
        time.sleep(30)  # past tools.timeout_s: the executor answers "timeout" and moves on
        return super().run(arguments)


def write_dataset(path: Path, seed: int = 0) -> None:
    """Synthetic tool tasks with the malformed rows spread among them."""
    rows = [json.dumps(row, ensure_ascii=False) for row in GENERATOR.rl_rows(400, seed, phrasings="unseen")]
    for i, bad in enumerate(MALFORMED_ROWS):
        rows.insert(5 + 37 * i, bad)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def run_total(rows: list[dict], key: str) -> float:
    """The total of a per-step count over training steps (`key`) and evaluations (`eval/key`)."""
    return sum(r.get(key, 0) + r.get(f"eval/{key}", 0) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="outputs/fault_drill")
    parser.add_argument("--model", default="tiny", help="model.name_or_path (default: the embedded tiny model)")
    args = parser.parse_args()
    out = Path(args.out)
    data = out / "tasks.jsonl"
    write_dataset(data)
    register_configs()
    overrides = [
        "data=jsonl", f"data.path={data}", "data.on_error=skip", "data.heldout_size=32",
        f"trainer.steps={args.steps}", "trainer.eval_every=4", "trainer.nan_loss_steps=[3]", "logger=none",
        "tools.timeout_s=0.5", f"model.name_or_path={args.model}",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=overrides))
    cfg.output_dir = str(out / "run")
    trainer = Trainer(cfg, model_path(cfg, Console()))
    trainer.sampler.executor.tools["get_current_time"] = RaisingTime()
    trainer.sampler.executor.tools["unit_converter"] = HangingConverter()
    started = time.perf_counter()
    trainer.fit()
    rows = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "faults/skipped_updates" in r]
    totals = {
        "malformed rows skipped": sum(r.get("data/skipped_rows", 0) for r in rows),
        "calls to the raising tool": RaisingTime.calls,
        "calls to the hanging tool": HangingConverter.calls,
        "error observations (tools/error_count, training and evaluation)": run_total(rows, "tools/error_count"),
        "timeouts (tools/timeout_count, training and evaluation)": run_total(rows, "tools/timeout_count"),
        "updates skipped (non-finite loss)": sum(r["faults/skipped_updates"] for r in train_rows),
        "steps completed": len(train_rows),
    }
    print(f"fault drill finished in {time.perf_counter() - started:.0f} s:")
    for name, value in totals.items():
        print(f"  {name}: {value:g}")


if __name__ == "__main__":
    main()
