"""A learned reward model's score, for the reward term `rm` (minirl/rewards/terms.py): MiniMind's reward-model
bonus. `reward.model.name_or_path` names a Hugging Face AutoModelForSequenceClassification with one output;
each step, `score` reads the conversations of the selected trajectories (reward.model.trajectories: MiniMind's
no-tool answers, or all) in batches of reward.model.batch_size, clips each score to [-clip, clip] and stores
it on the trajectory (`rm_score`), where the term reads it; the others get 0. With reward.model off,
`NoRewardModel` stands in and every `rm_score` stays 0.

What the reward model reads: the task's prompt messages, then per turn an assistant message with the turn's
visible text (reasoning and call markup removed) and its calls as OpenAI `tool_calls`, then a `tool`
message per result. Rendered by the reward model's own chat template, or, for a tokenizer without one, as
`plain_text` lines; a longer conversation than reward.model.max_tokens loses its beginning, never its answer.

How it departs from MiniMind (trainer/train_agent.py `calculate_rewards`): MiniMind scored every trajectory
without a tool call, `reward_model.get_score(messages, answer after </think>)`, added the score to the rule
reward and clipped the sum to [-3, 3]. Here `no_tool` takes only those that ended with an answer (one cut
short or invalid has none to judge), the score itself is clipped at reward.model.clip (3 by default), weighted
by reward.weights.rm, and summed and clipped with the other terms (reward.clip); `all` also judges tool use.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from minirl.config import RewardModelConfig, RewardModelTrajectories
from minirl.models.loading import load_reward_model
from minirl.rewards import used_tools
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.runtime import resolve_device

# which trajectories the reward model reads (reward.model.trajectories)
SELECTIONS: dict[RewardModelTrajectories, Callable[[Trajectory], bool]] = {
    RewardModelTrajectories.no_tool: lambda t: t.finish_reason is TrajectoryEnd.ANSWER and not used_tools(t),
    RewardModelTrajectories.all: lambda t: True,
}


class RewardModel(Protocol):
    """What reward shaping calls (minirl/training/shaping.py): `score` sets `rm_score` on each trajectory."""

    def score(self, trajs: Sequence[Trajectory]) -> None: ...

    def metrics(self) -> dict[str, float]:
        """`time/reward_model_s`: seconds spent scoring since the previous call (within time/rollout_s)."""
        ...


class NoRewardModel:
    """reward.model.name_or_path=null: nothing is scored, so every `rm_score` keeps its 0."""

    def score(self, trajs: Sequence[Trajectory]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"time/reward_model_s": 0.0}


NO_REWARD_MODEL = NoRewardModel()


def turn_messages(turn: Turn) -> list[dict]:
    """One turn as the reward model reads it: the assistant's visible text and OpenAI-style calls, then its
    results as `tool` messages."""
    assistant: dict = {"role": "assistant", "content": turn.parsed.content}
    if turn.parsed.tool_calls:
        assistant["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.parsed.tool_calls
        ]
    return [assistant, *(result.to_message() for result in turn.tool_results)]


def conversation(traj: Trajectory) -> list[dict]:
    """The prompt messages, then every turn's messages (`turn_messages`)."""
    return [*traj.task.messages, *(m for turn in traj.turns for m in turn_messages(turn))]


def plain_text(messages: Sequence[dict]) -> str:
    """A conversation for a tokenizer without a chat template: a `role: content` line per message, and after
    an assistant's content a `call: {"name": ..., "arguments": ...}` line per call.

    >>> plain_text([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    'user: Hi\\nassistant: Hello!'
    """
    lines = []
    for message in messages:
        lines.append(f"{message['role']}: {message.get('content') or ''}")
        for call in message.get("tool_calls", []):
            lines.append("call: " + json.dumps(call["function"], ensure_ascii=False))
    return "\n".join(lines)


class ClassifierRewardModel:
    """A sequence classifier with one output, loaded once, that scores conversations in batches (no_grad, eval
    mode): `score` runs once per scoring of a rollout round, and once per replayed reference answer."""

    def __init__(self, model, tokenizer, cfg: RewardModelConfig, device: torch.device) -> None:
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, cfg, device
        self.tokenizer.truncation_side = "left"  # past max_tokens, the beginning goes: the answer is at the end
        self.tokenizer.padding_side = "right"  # each row starts at position 0, as alone, in any transformers version
        self.seconds = 0.0

    def score(self, trajs: Sequence[Trajectory]) -> None:
        started = time.perf_counter()
        chosen = [t for t in trajs if SELECTIONS[self.cfg.trajectories](t)]
        for traj in trajs:
            traj.rm_score = 0.0
        for start in range(0, len(chosen), self.cfg.batch_size):
            batch = chosen[start : start + self.cfg.batch_size]
            scores = self.raw_scores([conversation(t) for t in batch]).clamp(-self.cfg.clip, self.cfg.clip)
            for traj, value in zip(batch, scores.tolist()):
                traj.rm_score = value
        self.seconds += time.perf_counter() - started

    @torch.no_grad()
    def raw_scores(self, conversations: Sequence[Sequence[dict]]) -> torch.Tensor:
        """[B] float32, the unclipped score of each conversation, read in one forward pass."""
        templated = self.tokenizer.chat_template is not None
        texts = [
            self.tokenizer.apply_chat_template(list(c), tokenize=False) if templated else plain_text(c)
            for c in conversations
        ]
        encoded = self.tokenizer(
            texts,
            add_special_tokens=not templated,  # a chat template writes its own special tokens
            truncation=True,
            max_length=self.cfg.max_tokens,
            padding=True,
            return_tensors="pt",
        ).to(self.device)
        logits = self.model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits  # [B, 1]
        return logits[:, 0].float().cpu()

    def metrics(self) -> dict[str, float]:
        seconds, self.seconds = self.seconds, 0.0
        return {"time/reward_model_s": seconds}


def build_reward_model(cfg: RewardModelConfig, device: torch.device, deterministic: bool) -> RewardModel:
    """The reward model of reward.model, on `device` (the trainer's) unless reward.model.device names another;
    `NoRewardModel` when reward.model.name_or_path is null. A path or device that does not work is a
    ConfigError naming its key."""
    if cfg.name_or_path is None:
        return NoRewardModel()
    if cfg.device != "auto":
        device = resolve_device(cfg.device, deterministic, key="reward.model.device")
    model, tokenizer = load_reward_model(cfg, device)
    return ClassifierRewardModel(model, tokenizer, cfg, device)
