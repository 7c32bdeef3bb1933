"""The reward model behind the reward term `rm` (minirl/training/reward_model.py), a real 2-layer Qwen2 sequence
classifier saved with save_pretrained: batches score as one conversation at a time does, within the clip, only
the trajectories it selects; a training run logs `reward/rm` and `time/reward_model_s` every step and scores a
replayed reference answer too; a bad path or value fails at start-up naming its key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from support import compose_config, debug_config
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config

from minirl.bootstrap import model_path
from minirl.config import Config, RewardConfig, RewardModelConfig, RewardModelTrajectories
from minirl.data.task import Task
from minirl.entry import check_value_overrides
from minirl.errors import ConfigError
from minirl.protocol.parsing import parse_turn
from minirl.rewards import REWARD_TERMS
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.base import ToolResult
from minirl.trainer import Trainer
from minirl.training.reward_model import NO_REWARD_MODEL, build_reward_model, conversation, plain_text
from minirl.training.shaping import score
from minirl.validate import validate

CPU = torch.device("cpu")


def save_classifier(path: Path, tokenizer, num_labels: int = 1, causal: bool = False) -> Path:
    """A 2-layer hidden-32 Qwen2 with `num_labels` outputs (a causal LM with `causal`), untrained, saved with
    `tokenizer` at `path`. Its weights are drawn wide (std 0.5), so that its score depends on the whole
    conversation and spreads over several units."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id, initializer_range=0.5,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = (AutoModelForCausalLM if causal else AutoModelForSequenceClassification).from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tokenizer) -> Path:
    """The reward model, with the tiny tokenizer and its chat template."""
    return save_classifier(tmp_path_factory.mktemp("reward_model"), tokenizer)


def scorer(path: Path, **settings):
    return build_reward_model(RewardModelConfig(name_or_path=str(path), **settings), CPU, deterministic=True)


def answered(text: str, question: str = "What is 2 + 2?") -> Trajectory:
    """A trajectory that answered `question` with `text`, no tool called."""
    task = Task(id="t", messages=[{"role": "user", "content": question}], tools=[], gt=["4"])
    turns = [Turn(text=text, parsed=parse_turn(text))]
    return Trajectory(task, 0, [1, 2], turns=turns, finish_reason=TrajectoryEnd.ANSWER)


def called_a_tool() -> Trajectory:
    """A trajectory that called calculate_math, read its result and answered."""
    call = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
    result = ToolResult(call_id="call_0", name="calculate_math", content='{"result": "4"}', status="ok", latency_s=0)
    traj = answered("2 + 2 = 4.")
    traj.turns.insert(0, Turn(text=call, parsed=parse_turn(call), tool_results=[result]))
    return traj


def invalid() -> Trajectory:
    traj = answered('<tool_call>\n{"name": oops\n</tool_call>')
    traj.finish_reason = TrajectoryEnd.INVALID
    return traj


ANSWERS = ["4", "It is 4.", "2 + 2 = 4, of course.", "Four.", "The sum of two and two is four, as anyone can check."]


def mixed() -> list[Trajectory]:
    return [*(answered(text) for text in ANSWERS), called_a_tool(), invalid()]


# -- the scorer --------------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_batches_score_as_one_conversation_at_a_time_does(rm_dir):
    batched = scorer(rm_dir, trajectories="all", batch_size=3, clip=1e6)
    single = scorer(rm_dir, trajectories="all", batch_size=1, clip=1e6)
    sizes = []
    batched.model.register_forward_hook(
        lambda module, args, kwargs, out: sizes.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    together, alone = mixed(), mixed()
    batched.score(together)
    single.score(alone)
    assert sizes == [3, 3, 1]  # 7 trajectories in batches of reward.model.batch_size
    assert [t.rm_score for t in together] == pytest.approx([t.rm_score for t in alone], abs=1e-4)
    assert len({round(t.rm_score, 3) for t in together}) == len(together)  # different texts, different scores
    assert batched.metrics()["time/reward_model_s"] > 0  # the time since the previous call
    assert batched.metrics() == {"time/reward_model_s": 0.0} == NO_REWARD_MODEL.metrics()


@pytest.mark.fast
def test_scores_are_clipped(rm_dir):
    unclipped = scorer(rm_dir, trajectories="all", clip=1e6)
    raw = unclipped.raw_scores([conversation(t) for t in mixed()])  # [7]
    clip = float(raw.abs().median())
    trajs = mixed()
    scorer(rm_dir, trajectories="all", clip=clip).score(trajs)
    assert [t.rm_score for t in trajs] == pytest.approx(raw.clamp(-clip, clip).tolist(), abs=1e-4)
    assert (raw.abs() > clip + 1e-3).any() and all(abs(t.rm_score) <= clip for t in trajs)


@pytest.mark.fast
def test_no_tool_scores_only_answers_given_without_a_tool(rm_dir):
    trajs = mixed()
    for traj in trajs:
        traj.rm_score = 5.0  # what an earlier scoring left is replaced
    scorer(rm_dir).score(trajs)  # reward.model.trajectories=no_tool, the default
    *answers, tool_use, cut = trajs
    assert all(t.rm_score != 0.0 for t in answers)
    assert tool_use.rm_score == 0.0 and cut.rm_score == 0.0
    everything = mixed()
    scorer(rm_dir, trajectories=RewardModelTrajectories.all).score(everything)
    assert all(t.rm_score != 0.0 for t in everything)
    assert [t.rm_score for t in everything[: len(answers)]] == pytest.approx([t.rm_score for t in answers], abs=1e-4)


@pytest.mark.fast
def test_the_conversation_read_is_the_visible_text_calls_and_results():
    messages = conversation(called_a_tool())
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == ""  # the call markup is not text
    assert messages[1]["tool_calls"][0]["function"] == {"name": "calculate_math", "arguments": {"expression": "2 + 2"}}
    assert messages[2]["content"] == '{"result": "4"}' and messages[3] == {"role": "assistant", "content": "2 + 2 = 4."}
    assert conversation(answered("<think>Easy.</think>Four."))[-1]["content"] == "Four."  # no reasoning
    assert plain_text(messages) == (
        "user: What is 2 + 2?\nassistant: \n"
        'call: {"name": "calculate_math", "arguments": {"expression": "2 + 2"}}\n'
        'tool: {"result": "4"}\nassistant: 2 + 2 = 4.'
    )


@pytest.mark.fast
def test_a_tokenizer_without_a_chat_template_reads_the_plain_text(rm_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    tokenizer.chat_template = None
    AutoModelForSequenceClassification.from_pretrained(rm_dir).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    plain = scorer(tmp_path)
    assert plain.tokenizer.chat_template is None
    messages = conversation(answered("It is 4."))
    with torch.no_grad():
        expected = plain.model(input_ids=torch.tensor([tokenizer(plain_text(messages))["input_ids"]])).logits[0, 0]
    assert plain.raw_scores([messages]).item() == pytest.approx(expected.item(), abs=1e-5)
    assert plain.raw_scores([messages]).item() != pytest.approx(scorer(rm_dir).raw_scores([messages]).item(), abs=1e-3)


@pytest.mark.fast
def test_a_long_conversation_loses_its_beginning_not_its_answer(rm_dir):
    long_a, long_b = answered("It is 4."), answered("It is 4.")
    for traj, word in ((long_a, "hello"), (long_b, "tools")):  # they differ in their first tokens only
        traj.task.messages.insert(0, {"role": "system", "content": f"{word} " * 40})
    short = scorer(rm_dir, trajectories="all", max_tokens=12)
    long = scorer(rm_dir, trajectories="all")
    pair = [conversation(long_a), conversation(long_b)]
    first, second = short.raw_scores(pair).tolist()
    assert first == pytest.approx(second, abs=1e-5)  # the same last 12 tokens
    first, second = long.raw_scores(pair).tolist()
    assert first != pytest.approx(second, abs=1e-3)


@pytest.mark.fast
def test_shaping_weighs_the_stored_score_as_the_term_rm(rm_dir):
    assert "rm" in REWARD_TERMS
    cfg = Config(reward=RewardConfig(weights={"rm": 0.5}, clip=100.0))
    trajs = mixed()
    score(trajs, cfg, scorer(rm_dir))
    for traj in trajs:
        assert traj.reward_terms["rm"] == pytest.approx(0.5 * traj.rm_score) and traj.reward == pytest.approx(
            sum(traj.reward_terms.values())
        )
    assert trajs[0].reward_terms["rm"] != 0.0
    unscored = mixed()
    score(unscored, cfg, NO_REWARD_MODEL)  # reward.model off
    assert all(t.reward_terms["rm"] == 0.0 for t in unscored)


# -- start-up ----------------------------------------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.model.clip=0", "reward.model.clip: must be > 0, got 0"),
        ("reward.model.batch_size=0", "reward.model.batch_size: must be > 0, got 0"),
        ("reward.model.max_tokens=-1", "reward.model.max_tokens: must be > 0, got -1"),
        ("reward.model.device=tpu", "reward.model.device: must be auto, cpu, mps, cuda or cuda:N, got 'tpu'"),
        ("reward.model.trajectories=some", "reward.model.trajectories: Invalid value 'some', expected one of"),
        ("reward.model.name_or_path=./no_such_rm", "reward.model.name_or_path: no checkpoint directory './no_such_rm'"),
    ],
)
def test_bad_reward_model_settings_fail_at_start_up_naming_the_key(override, message, tmp_path):
    """What the entry point runs before any model loads: the override on the schema, composition, `validate`."""
    with pytest.raises(ConfigError, match=f"^{message}"):
        check_value_overrides([override])
        validate(compose_config(tmp_path, tmp_path, override))


@pytest.mark.fast
def test_a_checkpoint_that_is_no_reward_model_is_refused(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="^reward.model.name_or_path: '.*' holds no saved model"):
        scorer(tmp_path)
    with pytest.raises(ConfigError, match="^reward.model.name_or_path: '.*' has 2 outputs; a reward model has one"):
        scorer(save_classifier(tmp_path / "two", tokenizer, num_labels=2))
    with pytest.raises(ConfigError, match="^reward.model.name_or_path: '.*' is no trained reward model: .*score"):
        scorer(save_classifier(tmp_path / "lm", tokenizer, causal=True))  # a causal LM: no score head
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^reward.model.device=cuda: no cuda device here"):
            scorer(tmp_path / "two", device="cuda")


# -- a training run ----------------------------------------------------------------------------------------------


def test_training_logs_the_reward_model_every_step_and_scores_a_replayed_reference(cache_dir, tmp_path, rm_dir):
    reward_model = [f"reward.model.name_or_path={rm_dir}", "reward.model.trajectories=all", "reward.weights.rm=1.0"]
    cfg = debug_config(cache_dir, tmp_path, *reward_model, "rollout.max_new_tokens=96")  # turns fit every reference
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)))
    task = next(t for t in trainer.sampler.tasks.tasks if t.expected_tool_calls)
    slot = Trajectory(task, 3, [])
    guide = trainer.sampler.reference_answer(slot)  # a replayed reference answer is scored like a sample
    assert guide is not None and guide.rm_score != 0.0 and guide.reward_terms["rm"] == guide.rm_score
    again = dataclasses.replace(guide, rm_score=0.0)
    trainer.sampler.reward_model.score([again])
    assert again.rm_score == pytest.approx(guide.rm_score, abs=1e-5)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r and "eval/success_rate" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["reward/rm"] != 0.0 and -cfg.reward.model.clip <= row["reward/rm"] <= cfg.reward.model.clip
        assert 0.0 < row["time/reward_model_s"] < row["time/rollout_s"] <= row["time/step_s"]
    evals = [r for r in rows if "eval/success_rate" in r]
    assert evals and all(r["eval/reward/rm"] == 0.0 for r in evals)  # held-out evaluation skips the reward model
