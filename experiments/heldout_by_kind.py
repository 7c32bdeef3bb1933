"""Greedy held-out success of checkpoints by task kind, on a held-out set larger than a run's own.

    python experiments/heldout_by_kind.py [--size 512] NAME=PATH [NAME=PATH ...]

A run evaluates on 64 held-out tasks, so one task is 1.6 points and the gain of a run is noisy. This draws
`--size` held-out tasks of the default data config (its first 64 are the run's own held-out set), drops
every task whose question is among the training tasks a run could have drawn, and evaluates each
checkpoint greedily through the training agent loop. Prints, per checkpoint, the share solved of each kind
(one call, two calls, no tool), which says which skill a run gained or lost. With --modes it also counts, per
kind, how the unsolved tasks failed (failure_mode).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace

from hydra import compose, initialize_config_dir
from rich.console import Console

from minirl.config import register_configs, to_config
from minirl.data import DATASETS
from minirl.data.generation import prompt_text
from minirl.data.task import Task
from minirl.entry import CONF_DIR
from minirl.evaluation.backends import LocalBackend
from minirl.metrics import success_by_kind
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd


def unseen_heldout(cfg, size: int) -> list[Task]:
    """The first `size` held-out tasks of `cfg.data` whose question no training task asks, one per question."""
    train = {prompt_text(t) for t in DATASETS.get(cfg.data.name)(cfg.data).train}
    seen, tasks = set(), []
    for task in DATASETS.get(cfg.data.name)(replace(cfg.data, heldout_size=size)).heldout:
        question = prompt_text(task)
        if question not in train and question not in seen:
            seen.add(question)
            tasks.append(task)
    return tasks


def failure_mode(traj: Trajectory, solved: bool) -> str:
    """Why a greedy trajectory did not solve its task, judged against the reference calls: the first of an
    unfinished or unparsable conversation, a call count that differs from the reference's, a wrong tool, wrong
    arguments, or right calls and an answer without every gt value."""
    if solved:
        return "solved"
    if traj.finish_reason is not TrajectoryEnd.ANSWER:
        return f"ended: {traj.finish_reason.value}"
    calls = [call for turn in traj.turns for call in turn.parsed.tool_calls]
    reference = [call["function"] for m in traj.task.reference for call in m.get("tool_calls", [])]
    if len(calls) != len(reference):
        return f"{len(calls)} calls, {len(reference)} needed"
    if any(call.name != ref["name"] for call, ref in zip(calls, reference)):
        return "wrong tool"
    if any(call.arguments != ref["arguments"] for call, ref in zip(calls, reference)):
        return "wrong arguments"
    return "answer misses a value"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512, help="held-out tasks to draw before dropping")
    parser.add_argument("--modes", action="store_true", help="also count how the unsolved tasks failed, per kind")
    parser.add_argument("checkpoints", nargs="+", help="NAME=PATH (a checkpoint directory, or tiny)")
    args = parser.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=["logger=none"]))
    tasks = unseen_heldout(cfg, args.size)
    solved = SUCCESS_CRITERIA.get(cfg.reward.success)
    counts = Counter(t.kind for t in tasks)
    kinds = sorted(counts)
    print("| checkpoint | all | " + " | ".join(kinds) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in kinds) + " |")
    for spec in args.checkpoints:
        name, path = spec.split("=", 1)
        run_cfg = replace(cfg, model=replace(cfg.model, name_or_path=path))
        trajs = LocalBackend(run_cfg, Console(quiet=True)).run(tasks)
        score_all(trajs, run_cfg.reward)
        rates = success_by_kind(trajs, solved, prefix="")
        cells = [f"{round(rates[f'success_rate/{k}'] * counts[k])} / {counts[k]}" for k in kinds]
        total = sum(map(solved, trajs)) / len(trajs)
        print(f"| {name} | {100 * total:.1f}% | " + " | ".join(cells) + " |", flush=True)
        if args.modes:
            for kind in kinds:
                modes = Counter(failure_mode(t, solved(t)) for t in trajs if t.task.kind == kind)
                print(f"    {kind}: " + ", ".join(f"{mode}: {n}" for mode, n in modes.most_common()), flush=True)


if __name__ == "__main__":
    main()
