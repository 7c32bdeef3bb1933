"""The run-time check that the sampler moved with the trainer (`rollout.sync_check_every`).

A weight sync that never reached the sampler fails silently: the run trains, nothing errors, and every rollout
still comes from the first weights. So on a check step one sequence sampled this step is scored three times:
by the trainer's weights before the update (`SyncProbe`, taken before it), by its weights after the update, and
by the engine after the sync (`Engine.score`, raw log-probs). A synced engine sits at the new weights, apart
from kernel noise; an engine the sync missed sits at the old ones (one sync lost) or further away (every sync
lost). The gaps are means over the sequence's tokens of |Δ log p|, in nats:

    rollout/sync_gap       engine vs the new weights      ~0 when synced
    rollout/sync_gap_prev  engine vs the weights before   ~ how far the update moved the sequence
    rollout/sync_stale     1 when the engine is not clearly closer to the new weights (the run warns)

"Clearly closer": sync_gap below half of sync_gap_prev, or below the noise floor of the policy's dtype
(`NOISE_FLOOR`), under which an engine on other kernels cannot be told from the trainer. An update too small to
move the sequence past that floor makes one check inconclusive (it stays quiet); a sync lost for good still
shows, as the engine drifts further from the trainer at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minirl.rollout.engine import Engine, sequence_logprobs
from minirl.rollout.trajectory import Trajectory

# mean |Δ log p| per token (nats) below which an engine counts as at the trainer's weights: fp32 engines agree to
# ~1e-5 (tests/test_engine_conformance.py); a bf16/fp16 engine on kernels of its own differs by ~1e-2
NOISE_FLOOR = {torch.float32: 1e-3, torch.float64: 1e-3}
HALF_PRECISION_FLOOR = 5e-2


@dataclass
class SyncProbe:
    """One sampled sequence and the trainer's log-probs of it under the weights about to be updated."""

    token_ids: list[int]  # [T] prompt + response of one trajectory of this step
    before: torch.Tensor  # [T - 1] log p(token_ids[t] | token_ids[:t]), raw, before the update


@dataclass
class SyncGaps:
    new: float  # mean |engine - trainer after the update|, nats per token
    prev: float  # mean |engine - trainer before the update|
    floor: float  # the noise floor of the policy's dtype

    @property
    def stale(self) -> bool:
        return self.new >= self.floor and self.new >= self.prev / 2

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/sync_gap": self.new,
            "rollout/sync_gap_prev": self.prev,
            "rollout/sync_stale": float(self.stale),
        }


def probe(policy, trajs: list[Trajectory], device: torch.device) -> SyncProbe:
    """Before the update: the first trajectory's tokens, scored by the policy as it is."""
    token_ids = [*trajs[0].prompt_ids, *trajs[0].response_ids]
    return SyncProbe(token_ids, sequence_logprobs(policy, token_ids, device))


def sync_gaps(sample: SyncProbe, engine: Engine, policy, device: torch.device) -> SyncGaps:
    """After the update and the sync: how far the engine's scores of the probe's sequence lie from the
    trainer's new and old weights'. Draws no random numbers."""
    after = sequence_logprobs(policy, sample.token_ids, device)
    served = engine.score(sample.token_ids).float()
    floor = NOISE_FLOOR.get(next(policy.parameters()).dtype, HALF_PRECISION_FLOOR)
    return SyncGaps(
        new=(served - after).abs().mean().item(), prev=(served - sample.before).abs().mean().item(), floor=floor
    )
