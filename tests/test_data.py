import json
import logging
import re
from dataclasses import replace

import pytest

from minirl.config import Config, DataConfig, OnError, SFTConfig
from minirl.data import DATASETS, WARM_START_CORPORA, Dataset, Task, load_jsonl, synthetic_tools
from minirl.data.generation import prompt_text
from minirl.data.jsonl import write_jsonl
from minirl.data.synthetic_tools import GENERATOR, rl_rows, sft_rows, train_heldout_split
from minirl.data.task import MAX_GT_VALUES, MAX_MESSAGES, task_from_row
from minirl.errors import ConfigError, DataError
from minirl.tools import MINIMIND_TOOL_NAMES, ToolExecutor, build_tools
from minirl.tools.base import ToolCall

pytestmark = pytest.mark.fast

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
        GENERATOR.generate(500, 0, set(), {"no_tool": 1.0}, phrasings=lambda: "core", unique=True)


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


def with_parameters(parameters) -> dict:
    return with_tools([{"type": "function", "function": {"name": "calculate_math", "parameters": parameters}}])


SCHEMA = build_tools(["calculate_math"])["calculate_math"].schema()
USER = {"role": "user", "content": "hi"}

BAD_ROWS = {
    "not an object": ([tool_row()], "a row must be a JSON object with 'conversations' and 'gt', got array"),
    "missing gt": ({k: v for k, v in tool_row().items() if k != "gt"}, "missing 'gt' (a list of the values"),
    "gt not a list": (tool_row(gt="4"), "'gt' must be a list of strings or numbers, got string"),
    "gt holds an object": (tool_row(gt=["4", {"a": 1}]), "gt[1] must be a string or a number, got object"),
    "gt holds a boolean": (tool_row(gt=[True]), "gt[0] must be a string or a number, got boolean"),
    "gt not finite": (tool_row(gt=[float("nan")]), "gt[0] must be a finite number, got nan"),
    "gt blank": (tool_row(gt=[" "]), "gt[0] is blank; expected a value a correct answer contains"),
    "huge gt": (tool_row(gt=list(range(MAX_GT_VALUES + 1))), "'gt' has 65 values, more than MAX_GT_VALUES=64"),
    "no conversations": ({"gt": []}, "'conversations' must be a non-empty list of messages, got nothing"),
    "conversations not a list": (tool_row(conversations="hi"), "'conversations' must be a non-empty list of messages"),
    "too many messages": (
        tool_row(conversations=[USER] * (MAX_MESSAGES + 1)),
        "'conversations' has 257 messages, more than MAX_MESSAGES=256",
    ),
    "message not an object": (with_message(1, "hi"), "message 1: must be an object with a 'role' and 'content'"),
    "message without role": (with_message(1, {"content": "hi"}), "message 1: missing 'role'; expected one of system"),
    "unknown role": (with_message(1, {"role": "human", "content": "hi"}), "message 1: unknown role 'human'; expected"),
    "role not a string": (with_message(1, {"role": 1, "content": "hi"}), "message 1: unknown role 1"),
    "message without content": (with_message(1, {"role": "user"}), "message 1: missing 'content' (a string)"),
    "content not a string": (
        with_message(1, {"role": "user", "content": 5}),
        "message 1: 'content' must be a string, got number",
    ),
    "no user": (tool_row(conversations=[{"role": "system", "content": "s"}]), "no user message"),
    "kind not a string": (tool_row(kind=["single"]), "'kind' must be a string, got array"),
    "id not a string": (tool_row(id=1.5), "'id' must be a string or integer, got number"),
    "tools on a user message": (with_message(1, {**USER, "tools": []}), "only system messages may carry 'tools'"),
    "tools not a list": (with_tools({"a": 1}), "message 0: 'tools' must be a list of OpenAI function schemas, got obj"),
    "tools bad JSON": (with_tools("[{"), "'tools' is a string that is not JSON"),
    "tool not a function": (with_tools([{"name": "f"}]), 'tools[0] must look like {"type": "function", "function"'),
    "tool without name": (with_tools([{"type": "function", "function": {}}]), "tools[0] needs a 'name' of 1 to 64"),
    "tool name with a space": (
        with_tools([{"type": "function", "function": {**SCHEMA["function"], "name": "calc math"}}]),
        "got 'calc math'",
    ),
    "tool description not a string": (
        with_tools([{"type": "function", "function": {**SCHEMA["function"], "description": 3}}]),
        "tools[0] ('calculate_math') 'description' must be a string",
    ),
    "tool without parameters": (
        with_tools([{"type": "function", "function": {"name": "calculate_math"}}]),
        "tools[0] ('calculate_math') has no 'parameters' (a JSON schema object)",
    ),
    "parameters an array schema": (with_parameters({"type": "array"}), "'parameters' must be a JSON schema object"),
    "parameters a list": (with_parameters([]), '{"type": "object", "properties": {...}}, or with no properties'),
    "properties not an object": (
        with_parameters({"type": "object", "properties": ["expression"]}),
        "'properties' must be an object mapping each argument name to its schema",
    ),
    "required not names": (
        with_parameters({"type": "object", "required": "expression"}),
        "'required' must be a list of argument names",
    ),
    "tool offered twice": (with_tools([SCHEMA, SCHEMA]), "message 0: the tool 'calculate_math' is offered twice"),
    "call to a tool not offered": (
        with_calls([{"name": "get_weather", "arguments": {}}]),
        "a tool call names 'get_weather', which the row's tools do not offer (offered: calculate_math)",
    ),
    "tool_calls not a list": (with_calls({"name": "f"}), "message 2: 'tool_calls' must be a list, got object"),
    "tool_calls bad JSON": (with_calls("[{"), "'tool_calls' is a string that is not JSON"),
    "tool call not an object": (with_calls([1]), "tool_calls[0] must be an object with a 'name' and 'arguments'"),
    "tool call without name": (with_calls([{"arguments": {}}]), "tool_calls[0] has no string 'name'"),
    "arguments not an object": (
        with_calls([{"name": "f", "arguments": "[1]"}]),
        "tool_calls[0] arguments must be an object, got array",
    ),
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


def test_the_bounds_admit_rows_at_the_limit():
    turns = [USER, {"role": "assistant", "content": "ok"}] * (MAX_MESSAGES // 2)
    assert len(task_from_row(tool_row(conversations=turns), "row").reference) == 1
    assert len(task_from_row(tool_row(gt=list(range(MAX_GT_VALUES))), "row").gt) == MAX_GT_VALUES
    tool_only = {"role": "assistant", "tool_calls": [CALL]}  # no 'content' at all: a message that only calls
    assert task_from_row(with_message(2, tool_only), "row") == task_from_row(tool_row(), "row")


# -- jsonl ---------------------------------------------------------------------------------------

MAX_ROW_BYTES = DataConfig().max_row_bytes
GOOD = json.dumps(tool_row()).encode()

# one line each, as bytes: every bad row above, and what only a file can hold
BAD_LINES = {
    **{name: (json.dumps(row).encode(), fragment) for name, (row, fragment) in BAD_ROWS.items()},
    "not JSON": (b'{"conversations": [', "not valid JSON (Expecting value at column 20); expected one JSON object"),
    "invalid UTF-8": (GOOD.replace(b"2 + 2?", b"2 \xff 2?"), "not valid UTF-8 (byte 0xff at byte offset"),
    "truncated UTF-8": (GOOD.replace(b"What", "Wh\u00e4t".encode()[:3]), "not valid UTF-8 (byte 0xc3 at byte offset"),
    "nested too deeply": (b"[" * 100_000, "not valid JSON (nested too deeply)"),
    "a number too long to read": (b'{"gt": [' + b"9" * 5000 + b"]}", "not valid JSON (Exceeds the limit"),
    "too long": (b'{"pad": "' + b"x" * MAX_ROW_BYTES + b'"}', f"more than data.max_row_bytes={MAX_ROW_BYTES}"),
}


def write_lines(path, *lines: bytes):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_jsonl_round_trip(tmp_path):
    rows = rl_rows(30, seed=2) + [tool_row(id="mine")]
    path = tmp_path / "nested" / "tasks.jsonl"
    write_jsonl(path, rows)
    assert load_jsonl(path, MAX_ROW_BYTES) == [task_from_row(row, "x") for row in rows]


def test_a_missing_or_unreadable_file_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path / 'none.jsonl'))}: cannot read it \\(No such file"):
        load_jsonl(tmp_path / "none.jsonl", MAX_ROW_BYTES)
    with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path))}: cannot read it \\(Is a directory"):
        load_jsonl(tmp_path, MAX_ROW_BYTES)


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_line_is_named_by_file_and_line_in_both_modes(tmp_path, name):
    line, fragment = BAD_LINES[name]
    path = write_lines(tmp_path / "tasks.jsonl", GOOD, b"", line, GOOD)
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}:3: ") as caught:
        load_jsonl(path, MAX_ROW_BYTES)
    assert fragment in str(caught.value)
    skipped: list[str] = []
    assert load_jsonl(path, MAX_ROW_BYTES, skipped) == [task_from_row(tool_row(), "x")] * 2
    assert skipped == [str(caught.value)]


def test_skip_keeps_exactly_the_good_rows_and_reports_the_bad_ones_in_line_order(tmp_path):
    good_rows = rl_rows(20, seed=4)
    bad = [BAD_LINES[name] for name in sorted(BAD_LINES)[:: len(BAD_LINES) // 10]][:10]  # ten kinds of bad line
    assert len(bad) == 10
    lines, bad_linenos = [], []
    for k, row in enumerate(good_rows):
        lines.append(json.dumps(row, ensure_ascii=False).encode())
        if k % 2:
            lines.append(bad[k // 2][0])
            bad_linenos.append(len(lines))
    path = write_lines(tmp_path / "tasks.jsonl", *lines)
    skipped: list[str] = []
    assert load_jsonl(path, MAX_ROW_BYTES, skipped) == [task_from_row(row, "x") for row in good_rows]
    assert [reason.split(": ", 1)[0] for reason in skipped] == [f"{path}:{n}" for n in bad_linenos]
    assert all(fragment in reason for reason, (_, fragment) in zip(skipped, bad, strict=True))
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}:{bad_linenos[0]}: "):
        load_jsonl(path, MAX_ROW_BYTES)


def test_row_size_limit_is_exact_and_an_over_long_line_does_not_hide_the_next(tmp_path):
    path = write_lines(tmp_path / "tasks.jsonl", GOOD, b"[" * 50 + b"x" * 10_000, GOOD)
    skipped: list[str] = []
    assert len(load_jsonl(path, len(GOOD), skipped)) == 2
    assert skipped == [f"{path}:2: the line has 10050 bytes, more than data.max_row_bytes={len(GOOD)}"]
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}:1: the line has {len(GOOD)} bytes"):
        load_jsonl(path, len(GOOD) - 1)
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(GOOD + b"\r\n" + GOOD + b"\r\n")
    assert len(load_jsonl(crlf, len(GOOD))) == 2  # the line break is not part of the row


def test_a_leading_byte_order_mark_is_allowed(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD + b"\n" + GOOD)  # and no newline at the end
    assert len(load_jsonl(path, MAX_ROW_BYTES)) == 2


def test_a_file_without_a_task_is_an_error_in_both_modes(tmp_path):
    empty = write_lines(tmp_path / "empty.jsonl", b"", b"  ")
    for skipped in (None, []):
        with pytest.raises(DataError, match=f"^{re.escape(str(empty))}: no rows$"):
            load_jsonl(empty, MAX_ROW_BYTES, skipped)
    all_bad = write_lines(tmp_path / "bad.jsonl", b"{", b"[]", b"\xff")
    skipped = []
    with pytest.raises(DataError, match=rf"^{re.escape(str(all_bad))}: all 3 rows are malformed; the first: .*:1: not"):
        load_jsonl(all_bad, MAX_ROW_BYTES, skipped)
    assert skipped == []


# -- dataset registry ----------------------------------------------------------------------------


def test_synthetic_dataset_loader():
    dataset = DATASETS.get("synthetic_tools")(config())
    assert (len(dataset.train), len(dataset.heldout), dataset.skipped) == (40, 8, [])
    assert all(isinstance(task, Task) for task in dataset.train + dataset.heldout)


def test_jsonl_dataset_loader(tmp_path):
    path, heldout_path = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    write_jsonl(path, rl_rows(20, seed=5))
    write_jsonl(heldout_path, rl_rows(3, seed=6))
    everything = load_jsonl(path, MAX_ROW_BYTES)
    split = DATASETS.get("jsonl")(config(path=str(path), heldout_size=5))
    assert split == Dataset(everything[:15], everything[15:], [])
    dataset = DATASETS.get("jsonl")(config(path=str(path), heldout_path=str(heldout_path)))
    assert dataset == Dataset(everything, load_jsonl(heldout_path, MAX_ROW_BYTES), [])
    with pytest.raises(ConfigError, match="data.path"):
        DATASETS.get("jsonl")(config())
    with pytest.raises(ConfigError, match="heldout_size"):
        DATASETS.get("jsonl")(config(path=str(path), heldout_size=20))


def test_jsonl_dataset_skips_bad_rows_of_both_files_and_logs_them(tmp_path, caplog):
    rows = [json.dumps(row).encode() for row in rl_rows(6, seed=5)]
    path = write_lines(tmp_path / "train.jsonl", rows[0], b"{", rows[1], b"[]", rows[2], b"\xff", b'{"gt": []}')
    heldout_path = write_lines(tmp_path / "heldout.jsonl", rows[3], b"nope")
    skip = config(path=str(path), heldout_path=str(heldout_path), on_error=OnError["skip"])
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}:2: not valid JSON"):
        DATASETS.get("jsonl")(replace(skip, on_error=OnError["raise"]))
    with caplog.at_level(logging.WARNING, logger="minirl.data"):
        dataset = DATASETS.get("jsonl")(skip)
    assert (len(dataset.train), len(dataset.heldout)) == (3, 1)
    where = [f"{path}:{n}" for n in (2, 4, 6, 7)] + [f"{heldout_path}:2"]
    assert [reason.split(": ")[0] for reason in dataset.skipped] == where
    report = dataset.skip_report()
    assert report.startswith("skipped 5 malformed rows (data.on_error=skip); first: ")
    assert "; ".join(dataset.skipped[:3]) in report and dataset.skipped[3] not in report
    assert caplog.messages == [report]


def test_each_warm_start_corpus_has_its_own_model_cache_key(tmp_path):
    """Each corpus, and each content of a jsonl corpus's file, keys its own model cache entry."""
    from minirl.bootstrap import cache_key

    assert WARM_START_CORPORA.names() == ["jsonl", "synthetic_math", "synthetic_math_no_tool", "synthetic_tools"]
    assert Config().sft.corpus == "synthetic_tools"
    keys = {cache_key(Config(sft=SFTConfig(corpus=name))) for name in WARM_START_CORPORA}
    assert len(keys) == len(WARM_START_CORPORA.names())
    with pytest.raises(
        ConfigError, match="unknown sft.corpus 'nope'; known: jsonl, synthetic_math, synthetic_math_no_tool, synthetic_"
    ):
        WARM_START_CORPORA.get("nope")
    path = tmp_path / "conversations.jsonl"
    write_jsonl(path, sft_rows(2, seed=0, exclude_prompts=set()))
    first = cache_key(Config(sft=SFTConfig(corpus="jsonl", path=str(path))))
    write_jsonl(path, sft_rows(2, seed=1, exclude_prompts=set()))
    assert cache_key(Config(sft=SFTConfig(corpus="jsonl", path=str(path)))) not in (first, *keys)
