"""Why `experiment=retool` learns little: the warm start's held-out mix by family and failure kind, and how many
training groups carry a signal.

    python experiments/retool_diagnosis.py [--size 256] [--groups 64] [--set KEY=VALUE ...] [NAME=PATH ...]

(default checkpoint: the preset's warm start, of the tiny model as --set shapes it)

For each checkpoint (NAME=PATH; `tiny`, the preset's warm start, when none is given): `--size` held-out tasks of
the preset, answered greedily through the training agent loop, each unsolved one put under the first failure
kind that fits it (invalid turn, cut by a budget, no code run, code that failed, no boxed answer, the right
number printed but another one boxed, code that dropped or changed one of the question's numbers, other wrong
code); then `--groups` training tasks x rollout.group_size samples at the rollout temperature, as a step
samples them: the share of groups whose rewards all tie (no advantage, so no gradient), per family. Also the
share of "extra" wordings (which the warm start sees in only sft.extra_wording_share of its rows) among the
training and the held-out questions.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import replace

from hydra import compose, initialize_config_dir
from rich.console import Console

from minirl.config import register_configs, to_config
from minirl.data import DATASETS
from minirl.data.generation import prompt_text
from minirl.data.synthetic_math import _FAMILIES
from minirl.entry import CONF_DIR
from minirl.evaluation.backends import LocalBackend
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.rewards.math_answer import last_boxed
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd

KINDS = (
    "solved", "invalid turn", "cut by a budget", "no code run", "code failed", "no boxed answer",
    "right output, other answer boxed", "a question number dropped or changed", "other wrong code",
)  # fmt: skip


def failure_kind(traj: Trajectory, solved: bool) -> str:
    """The first of KINDS that describes the trajectory."""
    if solved:
        return "solved"
    if traj.finish_reason is TrajectoryEnd.INVALID:
        return "invalid turn"
    if traj.finish_reason is not TrajectoryEnd.ANSWER:
        return "cut by a budget"
    results = [r for turn in traj.turns for r in turn.tool_results]
    if not results:
        return "no code run"
    if results[-1].status != "ok":
        return "code failed"
    if last_boxed(traj.final_text) is None:
        return "no boxed answer"
    if any(gt in r.content for gt in traj.task.gt for r in results):
        return "right output, other answer boxed"
    code = " ".join(str(call.arguments.get("code", "")) for turn in traj.turns for call in turn.parsed.tool_calls)
    if set(re.findall(r"\d+", prompt_text(traj.task))) - set(re.findall(r"\d+", code)):
        return "a question number dropped or changed"
    return "other wrong code"


EXTRA = [
    re.compile("^" + re.sub(r"\\\{\w+\\\}", ".+", re.escape(template)) + "$")
    for family in _FAMILIES.values()
    for template in family.question.extra
]  # a family's "extra" wordings, rare or absent in the warm start (sft.extra_wording_share)


def extra_wording(question: str) -> bool:
    return any(pattern.match(question) for pattern in EXTRA)


def extra_share(questions: list[str]) -> float:
    """The share of questions in an extra wording."""
    return sum(map(extra_wording, questions)) / max(1, len(questions))


def print_details(trajs: list[Trajectory]) -> None:
    """Why turns were invalid and which budget cut a trajectory, most common first, each with one last turn."""
    invalid = [t for t in trajs if t.finish_reason is TrajectoryEnd.INVALID]
    cut = [t for t in trajs if t.finish_reason not in (TrajectoryEnd.INVALID, TrajectoryEnd.ANSWER)]
    reasons = Counter(t.turns[-1].parsed.reason.split(":")[0] for t in invalid)
    limits = Counter(f"{t.finish_reason.value} in turn {len(t.turns)}" for t in cut)
    for title, counts, group in (("invalid turns", reasons, invalid), ("budget cuts", limits, cut)):
        print(f"{title}: " + ", ".join(f"{reason}: {n}" for reason, n in counts.most_common()))
        if group:
            print(f"    e.g. {prompt_text(group[0].task)!r} -> {group[0].turns[-1].text[:300]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="held-out tasks")
    parser.add_argument("--groups", type=int, default=64, help="training tasks sampled as groups")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides after the preset")
    parser.add_argument("checkpoints", nargs="*", default=["warm start=tiny"], help="NAME=PATH")
    args = parser.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(
            compose(
                "config", overrides=["experiment=retool", "logger=none", f"data.heldout_size={args.size}", *args.set]
            )
        )
    data = DATASETS.get(cfg.data.name)(cfg.data)
    solved = SUCCESS_CRITERIA.get(cfg.reward.success)
    train_questions = {prompt_text(t) for t in data.train}
    print(f"held-out questions also asked in training: {sum(prompt_text(t) in train_questions for t in data.heldout)}")
    print(f"extra wordings: training {extra_share([prompt_text(t) for t in data.train]):.0%}, "
          f"held-out {extra_share([prompt_text(t) for t in data.heldout]):.0%}")  # fmt: skip
    for spec in args.checkpoints:
        name, path = spec.split("=", 1)
        greedy = replace(cfg, model=replace(cfg.model, name_or_path=path))
        trajs = LocalBackend(greedy, Console(quiet=True)).run(data.heldout)
        score_all(trajs, cfg.reward)
        by_family: dict[str, Counter] = defaultdict(Counter)
        for traj in trajs:
            by_family[traj.task.kind][failure_kind(traj, solved(traj))] += 1
        total = Counter()
        for counts in by_family.values():
            total.update(counts)
        print(f"\n{name}: held-out {total['solved'] / len(trajs):.1%} of {len(trajs)}")
        print("| family | n | " + " | ".join(KINDS) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in KINDS) + " |")
        for family, counts in [*sorted(by_family.items()), ("all", total)]:
            print(f"| {family} | {sum(counts.values())} | " + " | ".join(str(counts[k]) for k in KINDS) + " |")
        for extra in (False, True):
            mine = [t for t in trajs if extra_wording(prompt_text(t.task)) == extra]
            kinds = Counter(failure_kind(t, solved(t)) for t in mine)
            print(f"{'extra' if extra else 'core'} wordings: {kinds['solved']} of {len(mine)} solved; "
                  + ", ".join(f"{k}: {n}" for k, n in kinds.most_common() if k != "solved"))  # fmt: skip
        print_details(trajs)
        if not args.groups:
            continue
        group = cfg.rollout.group_size
        sampled_cfg = replace(greedy, eval=replace(cfg.eval, samples=group, temperature=cfg.rollout.temperature))
        samples = LocalBackend(sampled_cfg, Console(quiet=True)).run(data.train[: args.groups])
        score_all(samples, cfg.reward)
        groups = [samples[start : start + group] for start in range(0, len(samples), group)]
        print(f"training groups of {group} at T={cfg.rollout.temperature}: "
              f"{sum(len({t.reward for t in g}) == 1 for g in groups)} of {len(groups)} tie")  # fmt: skip
        by_wording = defaultdict(list)
        for g in groups:
            by_wording[(g[0].task.kind, extra_wording(prompt_text(g[0].task)))].append(g)
        for (family, extra), mine in sorted(by_wording.items()):
            solved_all = sum(all(map(solved, g)) for g in mine)
            failed_all = sum(not any(map(solved, g)) for g in mine)
            rate = sum(solved(t) for g in mine for t in g) / (group * len(mine))
            print(f"    {family}, {'extra' if extra else 'core'} wordings: {len(mine)} groups, "
                  f"{solved_all} all solved, "
                  f"{failed_all} all failed, success {rate:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
