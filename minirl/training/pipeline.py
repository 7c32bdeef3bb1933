"""One step off (trainer.async_rollout): the rollout of step t+1 runs on a worker thread while step t trains.

    step t:   trainer  [ update on rollout t ]  wait  sync -> weights after step t
              worker   [ rollout t+1, from the weights after step t-1 ]

Every trajectory carries the policy version that sampled it (`Trajectory.policy_version`: the steps its weights
had trained); the weights a step updates are one version newer than one step off's samples, so its
trajectories are exactly 1 version old, and `fresh` drops any older than algo.max_staleness. The engine samples
from weights of its own (`Engine.detach`) that the trainer refreshes only once the worker is done, so an update
never changes weights a rollout reads. pi_old is then the trainer's forward pass before the update (the proximal
policy of decoupled PPO, algo.old_logprobs=recompute), and algo.rollout_is weighs each token by pi_old /
pi_sampler, the older sampler's gap, which `rollout_is/logp_gap_abs_mean` logs.

Only the rollout and the update overlap: evaluation, the trajectory log and checkpoints run between steps with
the worker idle. A checkpoint holds the sampled but untrained rollout of the next step, so a resumed run repeats
the uninterrupted one. The worker is the only thread that draws from the global torch RNG while the update runs
(nothing in the update draws: a model with dropout is refused at load, gradient checkpointing leaves the RNG
alone, the mini-batch order has its own generator), so a seeded run repeats.
What the overlap gains depends on what each side is bound by (experiments/README.md, "One step off").
A run that ends early (an error, Ctrl-C) cancels the rollout running ahead and waits for it to stop at its next
turn, so no thread samples on, holding the engine and drawing from the RNG, after the run is over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from minirl.rollout.trajectory import Trajectory


@dataclass
class Rollout:
    """A step's rollout: every trajectory sampled, the ones to learn from (guidance and dynamic sampling applied),
    its wall time (seconds) and the reward model's metrics of it (RewardModel.metrics)."""

    sampled: list[Trajectory]
    trajs: list[Trajectory]
    seconds: float
    version: int  # the policy version that sampled it (set on every trajectory)
    reward_model: dict[str, float] = field(default_factory=dict)


def timed(sample: Callable[[], tuple[list[Trajectory], list[Trajectory]]], version: int) -> Rollout:
    """Run `sample` (-> sampled, learned-from trajectories), stamp `version` on its trajectories and time it."""
    started = time.perf_counter()
    sampled, trajs = sample()
    for traj in [*sampled, *trajs]:  # a replayed reference answer (algo.guide) is in trajs alone
        traj.policy_version = version
    return Rollout(sampled, trajs, time.perf_counter() - started, version)


def fresh(trajs: list[Trajectory], version: int, max_staleness: int) -> tuple[list[Trajectory], dict[str, float]]:
    """(the trajectories sampled at most max_staleness versions before `version`, the weights about to train on
    them; async/staleness_mean|max of those kept and async/dropped_stale, how many were dropped)."""
    kept = [t for t in trajs if version - t.policy_version <= max_staleness]
    ages = [version - t.policy_version for t in kept]
    return kept, {
        "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "async/staleness_max": float(max(ages, default=0)),
        "async/dropped_stale": float(len(trajs) - len(kept)),
    }


class RolloutAhead:
    """The next step's rollout on one worker thread: `start` it before an update, `wait` for it after. `cancel`
    is the event the rollout stops on (run_agent's): `close` sets it."""

    def __init__(self, cancel: threading.Event) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="minirl-rollout")
        self._running: Future | None = None
        self.cancel = cancel

    def start(self, rollout: Callable[[], Rollout]) -> None:
        if self._running is not None:
            raise RuntimeError("a rollout is already running ahead; wait() for it first")
        self._running = self._pool.submit(rollout)

    def wait(self) -> tuple[Rollout, float]:
        """(the rollout, seconds waited for it); a failure in the worker raises here."""
        if self._running is None:
            raise RuntimeError("no rollout is running ahead")
        started = time.perf_counter()
        running, self._running = self._running, None
        return running.result(), time.perf_counter() - started

    def close(self) -> None:
        """Stop a rollout still running (the run ended without waiting for it) and wait until it has; its result
        and any error of its own are never read: what ended the run is the error to report."""
        if self._running is not None:
            self.cancel.set()  # it stops at its next turn (RolloutCancelled, rollout/agent_loop.py)
        self._pool.shutdown(wait=True)
