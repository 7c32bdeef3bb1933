import json
import re

import pytest

from minirl.config import Config, DataConfig, SFTConfig
from minirl.data import DATASETS, WARM_START_CORPORA, DataError, Task, load_jsonl, synthetic_tools
from minirl.data.generation import prompt_text
from minirl.data.jsonl import write_jsonl
from minirl.data.synthetic_tools import GENERATOR, rl_rows, sft_rows, train_heldout_split
from minirl.data.task import task_from_row
from minirl.protocol.parsing import ToolCall
from minirl.registry import ConfigError
from minirl.tools import MINIMIND_TOOL_NAMES, ToolExecutor, build_tools

# phrasings only RL sees (the "extra" ones); SFT rows must never use them
EXTRA_MARKERS = ("I need the value of", "Could you check the clock", "Two questions:", "I forgot the capital of")


@pytest.fixture(scope="module")
def rl_tasks() -> list[Task]:
    return [task_from_row(row, f"rl[{i}]") for i, row in enumerate(rl_rows(400, seed=7))]


def config(**overrides) -> DataConfig:
    return DataConfig(**{"train_size": 40, "heldout_size": 8, **overrides})


CALL = {"name": "calculate_math", "arguments": {"expression": "2 + 2"}}


def tool_row(**overrides) -> dict:
    schemas = json.dumps([build_tools(["calculate_math"])["calculate_math"].schema()])
    row = {
        "conversations": [
            {"role": "system", "content": "sys", "tools": schemas},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"result": "4"}'},
            {"role": "assistant", "content": "2 + 2 = 4."},
        ],
        "gt": [4],
    }
    return {**row, **overrides}


# -- synthetic generation -----------------------------------------------------------------------


def test_generation_is_deterministic_per_seed():
    assert rl_rows(60, seed=3) == rl_rows(60, seed=3)
    assert rl_rows(60, seed=3) != rl_rows(60, seed=4)
    assert sft_rows(60, seed=3, exclude_prompts=set()) == sft_rows(60, seed=3, exclude_prompts=set())


def test_train_and_heldout_never_share_a_prompt():
    train, heldout = train_heldout_split(500, 64, seed=0)
    assert (len(train), len(heldout)) == (500, 64)
    train_prompts, heldout_prompts = [prompt_text(t) for t in train], [prompt_text(t) for t in heldout]
    assert len(set(train_prompts)) == 500 and len(set(heldout_prompts)) == 64
    assert not set(train_prompts) & set(heldout_prompts)
    assert train_heldout_split(500, 64, seed=0) == (train, heldout)


def test_sft_rows_exclude_heldout_prompts_and_extra_phrasings():
    _, heldout = train_heldout_split(10, 64, seed=0)
    excluded = {prompt_text(task) for task in heldout}
    rows = sft_rows(800, seed=0, exclude_prompts=excluded)
    prompts = [prompt_text(row) for row in rows]
    assert len(rows) == 800 and not excluded & set(prompts)
    assert not any(marker in prompt for prompt in prompts for marker in EXTRA_MARKERS)
    rl_prompts = [prompt_text(row) for row in rl_rows(800, seed=0)]
    assert all(any(marker in prompt for prompt in rl_prompts) for marker in EXTRA_MARKERS)


def _template_pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(template)))


def _core_wording(task: Task) -> bool:
    """Whether the task's question fits one of the warm start's wordings for its kind and topic."""
    if task.kind == "double":
        templates = synthetic_tools._CONNECTORS.core
    elif task.kind == "single":
        tool = task.reference[0]["tool_calls"][0]["function"]["name"]
        templates = synthetic_tools._TOPICS[tool].question.core
    else:
        templates = [t for topic in synthetic_tools._RECALL_TOPICS for t in topic.question.core]
    return any(_template_pattern(t).fullmatch(prompt_text(task)) for t in templates)


def test_unseen_phrasings_give_rl_tasks_worded_unlike_any_warm_start_row():
    train, heldout = GENERATOR.train_heldout_split(300, 64, seed=0, phrasings="unseen")
    worded = [t for t in train + heldout if t.kind != "no_tool" or t.gt]  # greetings have one wording
    assert len(worded) > 300 and not [prompt_text(t) for t in worded if _core_wording(t)]
    _, seen = GENERATOR.train_heldout_split(300, 64, seed=0, phrasings="all")
    assert sum(map(_core_wording, seen)) > 20  # the check can fail


def test_a_phrasing_set_outside_the_known_ones_fails_at_start_up():
    with pytest.raises(ConfigError, match="data.phrasings: must be one of core, all, unseen"):
        DataConfig(phrasings="extra")


def test_family_mix_is_roughly_as_asked():
    sft = [row["kind"] for row in sft_rows(1000, seed=1, exclude_prompts=set())]
    rl = [row["kind"] for row in rl_rows(1000, seed=1)]
    assert 0.45 < sft.count("single") / 1000 < 0.65 and 0.12 < sft.count("no_tool") / 1000 < 0.28
    assert 0.18 < sft.count("double") / 1000 < 0.32
    assert 0.25 < rl.count("double") / 1000 < 0.45 and 0.12 < rl.count("no_tool") / 1000 < 0.28


def test_every_gt_value_is_in_the_reference_answer(rl_tasks):
    for task in rl_tasks:
        answer = task.reference[-1]
        assert answer["role"] == "assistant" and "tool_calls" not in answer
        assert all(value in answer["content"] for value in task.gt), (task.gt, answer)


def test_reference_tool_messages_are_what_the_executor_returns(rl_tasks):
    executor = ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=5.0, max_output_chars=10_000)
    for task in rl_tasks:
        offered = [tool["function"]["name"] for tool in task.tools]
        assert len(offered) == len(set(offered))
        calls = [call for message in task.reference for call in message.get("tool_calls", [])]
        observations = [message for message in task.reference if message["role"] == "tool"]
        assert len(calls) == len(observations) == {"single": 1, "double": 2, "no_tool": 0}[task.kind]
        assert not calls or len(task.gt) == len(calls)
        needed = {call["function"]["name"] for call in calls}
        assert needed <= set(offered) and len(offered) - len(needed) <= 2
        for call, observation in zip(calls, observations, strict=True):
            function = call["function"]
            result = executor.execute(ToolCall(call["id"], function["name"], function["arguments"]), allowed=offered)
            assert result.status == "ok"
            assert observation == result.to_message()


def test_double_calls_share_one_assistant_turn(rl_tasks):
    doubles = [task for task in rl_tasks if task.kind == "double"]
    assert doubles
    for task in doubles:
        assert [m["role"] for m in task.reference] == ["assistant", "tool", "tool", "assistant"]
        assert len(task.reference[0]["tool_calls"]) == 2
    assert any(len({c["function"]["name"] for c in t.reference[0]["tool_calls"]}) == 1 for t in doubles)


def test_a_too_small_prompt_space_fails_clearly():
    with pytest.raises(DataError, match="distinct synthetic prompts"):
        GENERATOR.generate(500, 0, set(), {"no_tool": 1.0}, phrasings="core", unique=True)


# -- task rows ----------------------------------------------------------------------------------


def test_task_from_row_normalises_the_reference():
    task = task_from_row(tool_row(kind="single"), "row")
    assert task.gt == ["4"] and task.kind == "single"
    assert task.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2 + 2?"}]
    assert [tool["function"]["name"] for tool in task.tools] == ["calculate_math"]
    call = {"id": "call_0", "type": "function", "function": CALL}
    assert task.reference[0] == {"role": "assistant", "content": "", "tool_calls": [call]}
    observation = {"role": "tool", "tool_call_id": "call_0", "name": "calculate_math", "content": '{"result": "4"}'}
    assert task.reference[1] == observation
    assert task.conversation == task.messages + task.reference


def test_tool_call_spellings_agree():
    arguments_as_text = {"name": "calculate_math", "arguments": json.dumps(CALL["arguments"])}
    openai_style = [{"id": "x", "type": "function", "function": arguments_as_text}]
    plain = task_from_row(tool_row(), "row")
    for spelling in (openai_style, json.dumps(openai_style), json.dumps([CALL])):
        row = with_message(2, {"role": "assistant", "content": None, "tool_calls": spelling})
        assert task_from_row(row, "row") == plain


def test_task_ids():
    assert task_from_row(tool_row(id=17), "row").id == "17"
    hashed = task_from_row(tool_row(), "row").id
    assert hashed == task_from_row(tool_row(), "other").id and len(hashed) == 16
    changed = tool_row()
    changed["conversations"][1] = {"role": "user", "content": "What is 3 + 3?"}
    assert task_from_row(changed, "row").id != hashed


def test_prompt_ends_at_the_last_user_message():
    row = {
        "conversations": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ],
        "gt": ["Paris"],
    }
    task = task_from_row(row, "row")
    assert [m["content"] for m in task.messages] == ["Hi", "Hello!", "Capital of France?"]
    assert task.reference == [{"role": "assistant", "content": "Paris."}] and task.tools == []


def with_message(index: int, message: dict) -> dict:
    row = tool_row()
    row["conversations"][index] = message
    return row


def with_tools(tools) -> dict:
    return with_message(0, {"role": "system", "content": "s", "tools": tools})


def with_calls(tool_calls) -> dict:
    return with_message(2, {"role": "assistant", "content": "", "tool_calls": tool_calls})


BAD_ROWS = {
    "missing gt": ({k: v for k, v in tool_row().items() if k != "gt"}, "missing 'gt'"),
    "gt not a list": (tool_row(gt="4"), "'gt' must be a list"),
    "gt holds an object": (tool_row(gt=[{"a": 1}]), "is not a string or number"),
    "no conversations": ({"gt": []}, "'conversations' must be a non-empty list"),
    "unknown role": (with_message(1, {"role": "human", "content": "hi"}), "message 1: unknown role 'human'"),
    "no user": (tool_row(conversations=[{"role": "system", "content": "s"}]), "no user message"),
    "content not a string": (with_message(1, {"role": "user", "content": 5}), "message 1: 'content' must be a string"),
    "tools not a list": (with_tools({"a": 1}), "message 0: 'tools' must be a list"),
    "tools bad JSON": (with_tools("[{"), "'tools' is a string that is not JSON"),
    "tool not a function": (with_tools([{"name": "f"}]), "tools[0] must look like"),
    "tool_calls not a list": (with_calls({"name": "f"}), "message 2: 'tool_calls' must be a list"),
    "tool_calls bad JSON": (with_calls("[{"), "'tool_calls' is a string that is not JSON"),
    "tool call without name": (with_calls([{"arguments": {}}]), "tool_calls[0] has no string 'name'"),
    "arguments not an object": (with_calls([{"name": "f", "arguments": "[1]"}]), "arguments must be an object"),
    "orphan tool message": (
        with_message(2, {"role": "assistant", "content": "thinking"}),
        "message 3: tool message does not answer any tool call",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_ROWS))
def test_bad_rows_raise_data_error_with_location(name):
    row, fragment = BAD_ROWS[name]
    with pytest.raises(DataError, match="^data.jsonl:12: ") as caught:
        task_from_row(row, "data.jsonl:12")
    assert fragment in str(caught.value)


# -- jsonl ---------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    rows = rl_rows(30, seed=2) + [tool_row(id="mine")]
    path = tmp_path / "nested" / "tasks.jsonl"
    write_jsonl(path, rows)
    assert load_jsonl(path) == [task_from_row(row, "x") for row in rows]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"conversations": [', "not valid JSON"),
        (json.dumps({k: v for k, v in tool_row().items() if k != "gt"}), "missing 'gt'"),
        (json.dumps(with_message(1, {"role": "robot", "content": "x"})), "unknown role 'robot'"),
        (json.dumps(with_tools("calculate_math")), "'tools'"),
        (json.dumps(with_calls([1])), "must be an object"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path, line, fragment):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(tool_row()) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"^{path}:3: ") as caught:
        load_jsonl(path)
    assert fragment in str(caught.value)


# -- dataset registry ----------------------------------------------------------------------------


def test_synthetic_dataset_loader():
    train, heldout = DATASETS.get("synthetic_tools")(config())
    assert (len(train), len(heldout)) == (40, 8)
    assert all(isinstance(task, Task) for task in train + heldout)


def test_jsonl_dataset_loader(tmp_path):
    path, heldout_path = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    write_jsonl(path, rl_rows(20, seed=5))
    write_jsonl(heldout_path, rl_rows(3, seed=6))
    everything = load_jsonl(path)
    assert DATASETS.get("jsonl")(config(path=str(path), heldout_size=5)) == (everything[:15], everything[15:])
    train, heldout = DATASETS.get("jsonl")(config(path=str(path), heldout_path=str(heldout_path)))
    assert train == everything and heldout == load_jsonl(heldout_path)
    with pytest.raises(ConfigError, match="data.path"):
        DATASETS.get("jsonl")(config())
    with pytest.raises(ConfigError, match="heldout_size"):
        DATASETS.get("jsonl")(config(path=str(path), heldout_size=20))


def test_each_warm_start_corpus_has_its_own_model_cache_key():
    from minirl.models.bootstrap import cache_key

    assert WARM_START_CORPORA.names() == ["synthetic_math", "synthetic_tools"]
    assert Config().sft.corpus == "synthetic_tools"
    keys = {cache_key(Config(sft=SFTConfig(corpus=name))) for name in WARM_START_CORPORA}
    assert len(keys) == len(WARM_START_CORPORA.names())
    with pytest.raises(ConfigError, match="unknown sft.corpus 'nope'; known: synthetic_math, synthetic_tools"):
        WARM_START_CORPORA.get("nope")
