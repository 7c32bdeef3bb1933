"""MiniMind's open_thinking (rollout.thinking_ratio): the tiny model's template has a thinking switch, training
rollouts draw per group or per trajectory which render with it on, the trajectory records it, and the success rate
is logged split by it. A template without the switch is refused at start-up."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console
from support import SHAPED_REWARD, debug_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.bootstrap import model_path
from minirl.config import ThinkingUnit
from minirl.errors import ConfigError
from minirl.protocol.chat import render, thinking_views
from minirl.rollout.thinking import draw_thinking
from minirl.trainer import Trainer

CLOSED_THINK = "<think>\n\n</think>\n\n"


def test_the_tiny_template_closes_an_empty_think_block_only_with_thinking_off(tiny_policy):
    _, tokenizer, tasks = tiny_policy
    task = tasks[0]
    texts = {}
    for name, kwargs in (("unset", {}), ("on", {"enable_thinking": True}), ("off", {"enable_thinking": False})):
        texts[name] = tokenizer.apply_chat_template(
            task.messages, tools=task.tools, tokenize=False, add_generation_prompt=True, **kwargs
        )
    assert texts["unset"] == texts["on"] and texts["unset"].endswith("<|im_start|>assistant\n")
    assert texts["off"] == texts["unset"] + CLOSED_THINK
    views = thinking_views(tokenizer)
    assert render(views[False], task.messages, task.tools, True) == tokenizer.encode(texts["off"])
    assert render(views[True], task.messages, task.tools, True) == tokenizer.encode(texts["on"])
    assert render(tokenizer, task.messages, task.tools, True) == tokenizer.encode(texts["unset"])  # left as it was


def test_draws_follow_the_ratio_per_group_or_per_trajectory():
    torch.manual_seed(0)
    assert draw_thinking(None, ThinkingUnit.group, 4, 2) is None
    assert draw_thinking(0.0, ThinkingUnit.trajectory, 4, 2) == [False] * 8
    assert draw_thinking(1.0, ThinkingUnit.group, 4, 2) == [True] * 8
    torch.manual_seed(0)
    by_group = draw_thinking(0.5, ThinkingUnit.group, 1000, 4)
    groups = [by_group[i : i + 4] for i in range(0, 4000, 4)]
    assert all(len(set(group)) == 1 for group in groups)
    assert 0.45 < sum(by_group) / 4000 < 0.55
    by_trajectory = draw_thinking(0.25, ThinkingUnit.trajectory, 1000, 4)
    assert 0.22 < sum(by_trajectory) / 4000 < 0.28
    assert any(len(set(by_trajectory[i : i + 4])) == 2 for i in range(0, 4000, 4))
    torch.manual_seed(0)
    assert draw_thinking(0.5, ThinkingUnit.group, 1000, 4) == by_group  # the run's RNG: reproducible


@pytest.mark.parametrize("unit", ["group", "trajectory"])
def test_a_run_with_a_thinking_ratio_renders_records_and_logs_the_split(cache_dir, tmp_path, unit):
    cfg = debug_config(
        cache_dir, tmp_path, SHAPED_REWARD, "rollout.thinking_ratio=0.5", f"rollout.thinking_unit={unit}",
        "trainer.prompts_per_step=4", "rollout.group_size=4", "algo.guide=false",  # every sampled trajectory kept
    )  # fmt: skip
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)), Console(quiet=True))
    metrics, trajs = trainer.train_step()
    assert all(t.thinking is not None for t in trajs)
    for traj in trajs:  # the prompt ends as the flag says
        prompt = trainer.tokenizer.decode(traj.prompt_ids)
        assert prompt.endswith(CLOSED_THINK) == (not traj.thinking)
    if unit == "group":
        assert all(len({t.thinking for t in trajs[i : i + 4]}) == 1 for i in range(0, len(trajs), 4))
    solved = [trainer.solved(t) for t in trajs]
    assert metrics["rollout/thinking_frac"] == sum(t.thinking for t in trajs) / len(trajs)
    for on, key in ((True, "rollout/success_rate_thinking"), (False, "rollout/success_rate_no_thinking")):
        side = [s for s, t in zip(solved, trajs) if t.thinking is on]
        assert metrics[key] == (sum(side) / len(side) if side else 0.0)
    heldout = trainer.sampler.rollout(trainer.heldout, 1, 0.0)  # held-out evaluation renders as configured: no draw
    assert all(t.thinking is None for t in heldout)


def test_the_default_run_draws_nothing_and_logs_no_split(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, SHAPED_REWARD)
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)), Console(quiet=True))
    metrics, trajs = trainer.train_step()
    assert all(t.thinking is None for t in trajs) and not any("thinking" in key for key in metrics)


def test_a_template_without_a_thinking_switch_is_refused_at_start(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "rollout.thinking_ratio=0.5")
    plain = tmp_path / "plain"
    model = AutoModelForCausalLM.from_pretrained(model_path(cfg, Console(quiet=True)))
    tokenizer = AutoTokenizer.from_pretrained(model_path(cfg, Console(quiet=True)))
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    model.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    cfg.model.name_or_path = str(plain)
    with pytest.raises(ConfigError, match="rollout.thinking_ratio: the chat template renders the same prompt"):
        Trainer(cfg, str(plain), Console(quiet=True))
