"""The synthetic_math dataset: seeded, split without shared prompts, and its reference tool
messages and answers are exactly what the real code interpreter prints."""

from __future__ import annotations

import json
import re

import pytest
from support import compose_config

from minirl.config import Config, DataConfig, SFTConfig
from minirl.data import DATASETS, Task
from minirl.data.generation import prompt_text
from minirl.data.synthetic_math import GENERATOR, NO_TOOL_GENERATOR, NO_TOOL_SYSTEM_PROMPT, SYSTEM_PROMPT
from minirl.data.task import task_from_row
from minirl.errors import ConfigError
from minirl.tools import ToolExecutor
from minirl.tools.base import ToolCall
from minirl.training.sft import sft_examples

KINDS = {"product", "sum", "mod_pow", "count_multiples", "count_primes", "power_digit_sum"}
# a fragment of each "extra" phrasing of each family: RL sees them, the warm start only under sft.extra_wording_share
EXTRA_MARKERS = (
    " times ", "What do you get when you multiply",
    "Find the total of", " add up to?",
    ", modulo ", "What remainder does",
    "Among 1, 2, ...,", "How many multiples of",
    "less than or equal to", "primes are in 1..",
    "Add up all the digits of", "If you write out",
)  # fmt: skip


@pytest.fixture(scope="module")
def rl_tasks() -> list[Task]:
    return [task_from_row(row, f"rl[{i}]") for i, row in enumerate(GENERATOR.rl_rows(300, seed=7))]


def config(**overrides) -> DataConfig:
    return DataConfig(**{"train_size": 500, "heldout_size": 64, **overrides})


@pytest.mark.fast
def test_generation_is_deterministic_per_seed():
    assert GENERATOR.rl_rows(60, seed=3) == GENERATOR.rl_rows(60, seed=3)
    assert GENERATOR.rl_rows(60, seed=3) != GENERATOR.rl_rows(60, seed=4)
    assert GENERATOR.sft_rows(60, seed=3, exclude_prompts=set()) == GENERATOR.sft_rows(60, 3, set())


@pytest.mark.fast
def test_train_and_heldout_never_share_a_prompt():
    dataset = DATASETS.get("synthetic_math")(config())
    train, heldout = dataset.train, dataset.heldout
    assert (len(train), len(heldout), dataset.skipped) == (500, 64, [])
    train_prompts, heldout_prompts = {prompt_text(t) for t in train}, {prompt_text(t) for t in heldout}
    assert len(train_prompts) == 500 and len(heldout_prompts) == 64
    assert not train_prompts & heldout_prompts
    assert DATASETS.get("synthetic_math")(config()) == dataset


@pytest.mark.fast
def test_warm_start_rows_exclude_heldout_prompts_and_extra_phrasings():
    heldout = DATASETS.get("synthetic_math")(config(train_size=10)).heldout
    excluded = {prompt_text(task) for task in heldout}
    prompts = [prompt_text(row) for row in GENERATOR.sft_rows(600, seed=0, exclude_prompts=excluded)]
    assert len(prompts) == 600 and not excluded & set(prompts)
    assert not any(marker in prompt for prompt in prompts for marker in EXTRA_MARKERS)
    rl_prompts = [prompt_text(row) for row in GENERATOR.rl_rows(600, seed=0)]
    assert all(any(marker in prompt for prompt in rl_prompts) for marker in EXTRA_MARKERS)


def is_extra(prompt: str) -> bool:
    return any(marker in prompt for marker in EXTRA_MARKERS)


@pytest.mark.fast
def test_a_share_of_warm_start_rows_uses_the_extra_wordings_and_the_rest_stays_as_it_was():
    plain = GENERATOR.sft_rows(600, seed=0, exclude_prompts=set())
    mixed = GENERATOR.sft_rows(600, seed=0, exclude_prompts=set(), extra_wording_share=0.2)
    assert GENERATOR.sft_rows(600, seed=0, exclude_prompts=set(), extra_wording_share=0.0) == plain
    extra = [is_extra(prompt_text(row)) for row in mixed]
    assert 0.15 < sum(extra) / len(extra) < 0.25
    assert {row["kind"] for row, e in zip(mixed, extra, strict=True) if e} == KINDS
    everything = GENERATOR.sft_rows(200, seed=0, exclude_prompts=set(), extra_wording_share=1.0)
    assert all(is_extra(prompt_text(row)) for row in everything)


@pytest.mark.fast
def test_train_phrasings_word_the_training_tasks_alone_and_leave_the_heldout_set_as_it_was():
    both = DATASETS.get("synthetic_math")(config())
    extra_only = DATASETS.get("synthetic_math")(config(train_phrasings="unseen"))
    assert extra_only.heldout == both.heldout
    assert all(is_extra(prompt_text(task)) for task in extra_only.train)
    assert 0.2 < sum(is_extra(prompt_text(task)) for task in both.train) / len(both.train) < 0.8
    assert not {prompt_text(t) for t in extra_only.train} & {prompt_text(t) for t in extra_only.heldout}
    assert DATASETS.get("synthetic_math")(config(train_phrasings="all")) == both
    with pytest.raises(ConfigError, match="data.train_phrasings: must be null or one of core, all, unseen"):
        DataConfig(train_phrasings="extra")


@pytest.mark.fast
def test_the_no_tool_rows_ask_the_same_questions_and_answer_at_once():
    with_tool = DATASETS.get("synthetic_math")(config(train_size=50))
    without = DATASETS.get("synthetic_math_no_tool")(config(train_size=50))
    for a, b in zip(with_tool.train + with_tool.heldout, without.train + without.heldout, strict=True):
        assert (prompt_text(a), a.gt, a.kind) == (prompt_text(b), b.gt, b.kind)
        assert b.messages[0] == {"role": "system", "content": NO_TOOL_SYSTEM_PROMPT} and b.tools == []
        assert b.reference == [{"role": "assistant", "content": f"The answer is \\boxed{{{b.gt[0]}}}."}]
    rows = NO_TOOL_GENERATOR.sft_rows(100, seed=0, exclude_prompts=set())
    assert [prompt_text(r) for r in rows] == [prompt_text(r) for r in GENERATOR.sft_rows(100, 0, set())]


@pytest.mark.fast
def test_rows_are_one_code_call_then_a_boxed_answer(rl_tasks):
    assert {task.kind for task in rl_tasks} == KINDS
    for task in rl_tasks:
        assert task.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert [tool["function"]["name"] for tool in task.tools] == ["code_interpreter"]
        assert [m["role"] for m in task.reference] == ["assistant", "tool", "assistant"]
        assert task.expected_tool_calls == 1 and len(task.gt) == 1
        assert task.reference[-1]["content"] == f"The answer is \\boxed{{{task.gt[0]}}}."


def largest_number_in_code(task: Task) -> int:
    return max(map(int, re.findall(r"\d+", task.reference[0]["tool_calls"][0]["function"]["arguments"]["code"])))


def test_reference_tool_messages_and_answers_are_what_the_real_tool_prints(rl_tasks, tmp_path):
    """Under experiment=retool's own time limit, the largest of each family's problems among them."""
    hardest = [max((t for t in rl_tasks if t.kind == kind), key=largest_number_in_code) for kind in sorted(KINDS)]
    sample = hardest + rl_tasks[:6]
    tools_cfg = compose_config(tmp_path, tmp_path, "experiment=retool").tools
    assert tools_cfg.names == ["code_interpreter"]
    executor = ToolExecutor.from_config(tools_cfg)
    calls = [task.reference[0]["tool_calls"][0] for task in sample]
    results = executor.execute_many(
        [ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    )
    for task, result in zip(sample, results, strict=True):
        assert result.status == "ok", result.content
        assert json.loads(result.content) == {"output": task.gt[0] + "\n"}
        assert task.reference[1] == result.to_message()


@pytest.mark.fast
def test_warm_start_examples_tokenize(tokenizer):
    cfg = Config(
        data=DataConfig(name="synthetic_math", train_size=10, heldout_size=8),
        sft=SFTConfig(corpus="synthetic_math", rows=12),
    )
    examples = sft_examples(tokenizer, cfg)
    assert len(examples) == 12
    for example in examples:
        assert len(example.input_ids) == len(example.loss_mask) and 0 < sum(example.loss_mask) < len(example.loss_mask)
        trained = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
        assert "code_interpreter" in trained and "\\boxed{" in trained
