"""What stops a run, and how a failure is told: out-of-memory errors with the sizes that caused them,
and runs of non-finite updates.

A tool that raises or hangs never stops a run (the executor turns it into an error observation,
minirl/tools/executor.py); a malformed dataset row is raised or skipped by `data.on_error`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from minirl.errors import TrainingError


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory error, or the CPU allocator failing to allocate."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@contextmanager
def reported_out_of_memory(phase: str, rows: int, longest: int, hint: str) -> Iterator[None]:
    """Turn an out-of-memory error inside the block into a TrainingError naming the phase, the batch's size
    (`rows` sequences, the longest `longest` tokens) and what to lower (`hint`); other errors pass unchanged."""
    try:
        yield
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        raise TrainingError(
            f"out of memory during {phase}: {rows} sequences, the longest {longest} tokens; {hint}"
        ) from err


def rollout_memory_hint(phase: str, rows: int, max_total_tokens: int):
    """`reported_out_of_memory` for a rollout of `rows` trajectories of at most `max_total_tokens` tokens."""
    hint = "lower rollout.group_size, trainer.prompts_per_step, algo.prompts_per_round or rollout.max_total_tokens"
    return reported_out_of_memory(phase, rows, max_total_tokens, hint)


def update_memory_hint(phase: str, rows: int, longest: int):
    """`reported_out_of_memory` for an update in micro-batches of `rows` sequences, the longest `longest` tokens."""
    hint = "lower trainer.micro_batch_size (gradients accumulate to the same update) or rollout.max_total_tokens"
    return reported_out_of_memory(phase, rows, longest, hint)


class BadStepCounter:
    """Steps in a row that skipped an update for a non-finite loss or gradient; `limit` in a row stop the run."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0

    def count(self, step: int, skipped: int, console) -> None:
        """Record this step's skipped updates: a warning on the console when it skipped any, and TrainingError
        once `limit` steps in a row did."""
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        if not skipped:
            return
        console.print(
            f"[bold yellow]warning[/]: step {step}: non-finite loss or gradient, {skipped} update(s) skipped "
            f"({self.in_a_row} step(s) in a row; the run stops at {self.limit})"
        )
        if self.in_a_row >= self.limit:
            raise TrainingError(
                f"steps {step - self.limit + 1}-{step}: every one had a non-finite loss or gradient, their "
                "updates were skipped; lower trainer.lr or check the rewards, then continue from the newest "
                "checkpoint with trainer.resume=auto"
            )
