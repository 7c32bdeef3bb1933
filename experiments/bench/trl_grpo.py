"""One TRL `GRPOTrainer` run of the bench's single-turn work (workload.py); prints its step times as JSON.

    python experiments/bench/trl_grpo.py MODEL_DIR [--bf16]

The configuration is pinned here so the comparison cannot drift: the same model, prompts, group size,
token limit, temperature, beta, learning rate (constant) and steps as minirl's run; one generation batch
and one optimizer step per step, its fastest shape here (per-device batch 8 with 4 accumulation steps took
3.1 s a step against 2.6 s on a slower day, 1.62 s against 1.64 s on a faster one); no gradient checkpointing,
as minirl's default (TRL's default turns it on; on this model it changed the step by under 0.1 s); the loss
averaged over tokens (TRL's "dapo", minirl's loss.agg=token-mean); the KL estimator k3 in both. Float32
throughout, as minirl's default; with --bf16, TRL's default `bf16=True`: accelerate's bf16 autocast around the
model's forward, sampling included.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import workload
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


class StepTimer(TrainerCallback):
    """Wall seconds of every optimizer step, generation included (TRL samples inside the step)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def sum_reward(completions, answer, **kwargs) -> list[float]:
    """1 when the completion contains the sum (minirl's gt_hit on one value), else 0."""
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def main() -> None:
    warnings.filterwarnings("ignore")
    model_dir, bf16 = sys.argv[1], "--bf16" in sys.argv[2:]
    rows = workload.PROMPTS * workload.STEPS  # each step draws PROMPTS fresh prompts
    prompts = [[{"role": "user", "content": workload.QUESTIONS[i % workload.PROMPTS]}] for i in range(rows)]
    answers = [workload.ANSWERS[i % workload.PROMPTS] for i in range(rows)]
    args = GRPOConfig(
        output_dir="/tmp/minirl-bench-trl",
        per_device_train_batch_size=workload.PROMPTS * workload.GROUP,  # one generation batch, one optimizer step
        num_generations=workload.GROUP,
        max_completion_length=workload.MAX_NEW_TOKENS,
        temperature=1.0,
        beta=workload.BETA,
        learning_rate=workload.LR,
        lr_scheduler_type="constant",
        max_steps=workload.STEPS,
        num_iterations=1,
        loss_type="dapo",
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=bf16,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        disable_tqdm=True,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=sum_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts, "answer": answers}), callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    print(json.dumps({"system": "trl", "step_s": timer.seconds}))


if __name__ == "__main__":
    main()
