"""MiniMind's open_thinking: which trajectories of a training rollout render with the chat template's thinking on.

`rollout.thinking_ratio` of them do (enable_thinking=true), the rest render with it off. The unit of a draw is a
setting (`rollout.thinking_unit`): a group (all samples of a task alike, so a group's advantages compare
trajectories that saw one prompt) or a trajectory (MiniMind's). The draw uses torch's global RNG, the run's, whose
state checkpoints save, so a resumed run draws as the uninterrupted one; with the ratio at null nothing is drawn.
"""

from __future__ import annotations

import torch

from minirl.config import ThinkingUnit


def draw_thinking(ratio: float | None, unit: ThinkingUnit, tasks: int, group_size: int) -> list[bool] | None:
    """Per trajectory, task-major (`group_size` per task), whether it renders with thinking on; None when `ratio`
    is None (no draw: the template kwargs as configured)."""
    if ratio is None:
        return None
    if unit is ThinkingUnit.group:
        return [bool(on) for on in (torch.rand(tasks) < ratio).repeat_interleave(group_size).tolist()]
    return [bool(on) for on in (torch.rand(tasks * group_size) < ratio).tolist()]
