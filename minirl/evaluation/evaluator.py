"""evaluate(cfg, console): held-out tasks -> backend -> rewards -> report (printed and saved).

from minirl.config import Config, EvalConfig
from minirl.evaluation.evaluator import evaluate
report = evaluate(Config(eval=EvalConfig(samples=4, temperature=1.0)))
report.metrics["pass_at_n"]
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from minirl.config import Config
from minirl.data import DATASETS
from minirl.evaluation.backends import EVAL_BACKENDS
from minirl.evaluation.report import EvalReport, RunInfo, print_report
from minirl.evaluation.summary import build_report
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.tools.base import check_offered_tools
from minirl.validate import validate


def evaluate(cfg: Config, console: Console | None = None) -> EvalReport:
    """Run the first eval.max_tasks held-out tasks of `data` through eval.backend; print the report and save it
    to eval.output (relative to the run directory)."""
    console = console or Console()
    make_backend = EVAL_BACKENDS.get(cfg.eval.backend)  # every name resolves before any model loads
    validate(cfg)
    solved = SUCCESS_CRITERIA.get(cfg.reward.success)
    tasks = DATASETS.get(cfg.data.name)(cfg.data).heldout[: cfg.eval.max_tasks]
    check_offered_tools((schema for task in tasks for schema in task.tools), cfg.tools.names)
    backend = make_backend(cfg, console)
    console.print(f"evaluating {backend.model} ({cfg.eval.backend}) on {len(tasks)} tasks x {cfg.eval.samples}")
    started = time.perf_counter()
    trajs = backend.run(tasks)
    wall_s = time.perf_counter() - started
    score_all(trajs, cfg.reward)
    run = RunInfo(
        backend=cfg.eval.backend,
        model=backend.model,
        dataset=cfg.data.name,
        data_path=cfg.data.heldout_path or cfg.data.path,
        samples=cfg.eval.samples,
        temperature=cfg.eval.temperature,
        seed=cfg.eval.seed,
        tasks=len(tasks),
        wall_s=wall_s,
    )
    report = build_report(trajs, tasks, solved, run)
    print_report(report, console)
    output = Path(cfg.output_dir) / cfg.eval.output  # an absolute eval.output stays as it is
    report.save(output)
    console.print(f"wrote {output}")
    return report
