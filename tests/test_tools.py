import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from minirl.data import load_jsonl
from minirl.errors import ConfigError
from minirl.tools import (
    MINIMIND_TOOL_NAMES,
    TOOLS,
    Tool,
    ToolError,
    ToolExecutor,
    ToolResult,
    build_tools,
    validate_arguments,
)
from minirl.tools.base import ToolCall, check_offered_tools

pytestmark = pytest.mark.fast

SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "count": {"type": "integer"},
        "scale": {"type": "number"},
        "flag": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["m", "km"]},
        "level": {"enum": ["low", 1]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "inner": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
    },
    "required": ["text"],
    "additionalProperties": False,
}


# rows in MiniMind's agent-RL format, offering MiniMind's TOOLS as its trainer declares them
MINIMIND_ROWS = Path(__file__).parent / "data" / "minimind_agent_rl.jsonl"


def minimind_tools() -> list[dict]:
    """MiniMind's six function schemas, verbatim (every row of MINIMIND_ROWS offers them on its system message)."""
    row = json.loads(MINIMIND_ROWS.read_text(encoding="utf-8").splitlines()[0])
    return json.loads(row["conversations"][0]["tools"])


@pytest.fixture(scope="module")
def executor() -> ToolExecutor:
    return ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=2048)


def run_tool(executor: ToolExecutor, name: str, **arguments) -> dict:
    result = executor.execute(ToolCall("call_0", name, arguments))
    assert result.status == "ok", result.content
    return json.loads(result.content)


# -- validate_arguments -------------------------------------------------------------------------


def test_valid_arguments_have_no_problems():
    arguments = {"text": "a", "count": 3, "scale": 0.5, "flag": True, "unit": "km", "tags": ["x"], "inner": {"x": 1}}
    assert validate_arguments(SCHEMA, arguments) == []
    assert validate_arguments(SCHEMA, {"text": "a", "count": 3.0}) == []  # an integral float is an integer
    assert validate_arguments(SCHEMA, {"text": "a", "level": 1.0}) == []  # one number in JSON


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "missing required argument 'text'"),
        ({"text": 1}, "argument 'text' must be of type string, got number"),
        ({"text": "a", "count": 2.5}, "argument 'count' must be of type integer"),
        ({"text": "a", "count": True}, "argument 'count' must be of type integer, got boolean"),
        ({"text": "a", "scale": False}, "argument 'scale' must be of type number, got boolean"),
        ({"text": "a", "scale": float("nan")}, "argument 'scale' must be of type number"),
        ({"text": "a", "scale": "1"}, "argument 'scale' must be of type number, got string"),
        ({"text": "a", "flag": 1}, "argument 'flag' must be of type boolean"),
        ({"text": "a", "unit": "mile"}, "argument 'unit' must be one of: m, km"),
        ({"text": "a", "level": True}, "argument 'level' must be one of: low, 1; got true"),  # true is not 1
        ({"text": "a", "tags": [1]}, "argument 'tags[0]' must be of type string"),
        ({"text": "a", "inner": {}}, "missing required argument 'inner.x'"),
        ({"text": "a", "extra": 1}, "unexpected argument 'extra'"),
    ],
)
def test_invalid_arguments_are_named(arguments, fragment):
    problems = validate_arguments(SCHEMA, arguments)
    assert any(fragment in problem for problem in problems), problems


def test_non_object_arguments_are_rejected():
    assert validate_arguments(SCHEMA, [1, 2]) == ["arguments must be of type object, got array"]


def test_every_problem_is_listed():
    assert len(validate_arguments(SCHEMA, {"text": 1, "unit": "mile", "extra": 0})) == 3


OPTIONAL = {  # Optional[int] in the three spellings users' OpenAI schemas use, and a oneOf union
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "type list": {"type": ["integer", "null"]},
    "nullable": {"type": "integer", "nullable": True},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string", "enum": ["all"]}]},
}
ACCEPTED = {  # value -> the shapes that accept it
    5: {"anyOf", "type list", "nullable", "oneOf"},
    7.0: {"anyOf", "type list", "nullable", "oneOf"},  # an integral float is an integer
    None: {"anyOf", "type list", "nullable"},
    "all": {"oneOf"},
    "5": set(),  # the text of a number reaches no integer parameter
}


@pytest.mark.parametrize("shape", OPTIONAL)
@pytest.mark.parametrize("value", ACCEPTED)
def test_optional_and_union_parameters_accept_exactly_their_alternatives(shape, value):
    problems = validate_arguments({"type": "object", "properties": {"n": OPTIONAL[shape]}}, {"n": value})
    assert (problems == []) is (shape in ACCEPTED[value]), problems


@pytest.mark.parametrize(
    ("schema", "value", "problem"),
    [
        (
            OPTIONAL["anyOf"],
            "5",
            "argument 'n' matches none of the anyOf alternatives (argument 'n' must be of type integer, got string; "
            "argument 'n' must be of type null, got string)",
        ),
        (OPTIONAL["type list"], "5", "argument 'n' must be of type integer or null, got string"),
        (OPTIONAL["nullable"], True, "argument 'n' must be of type integer or null, got boolean"),
        (
            {"oneOf": [{"type": "number"}, {"type": "integer"}]},
            3,
            "argument 'n' matches 2 of the oneOf alternatives; it must match exactly one",
        ),
        (
            {"anyOf": [{"type": "object", "required": ["x"]}, {"type": "null"}]},
            {},
            "argument 'n' matches none of the anyOf alternatives (missing required argument 'n.x'; "
            "argument 'n' must be of type null, got object)",
        ),
    ],
)
def test_a_value_outside_the_alternatives_is_named(schema, value, problem):
    assert validate_arguments({"type": "object", "properties": {"n": schema}}, {"n": value}) == [problem]


# -- registry and schemas -----------------------------------------------------------------------


def test_the_six_tools_are_registered_under_their_own_names():
    assert set(MINIMIND_TOOL_NAMES) <= set(TOOLS.names())
    for name in MINIMIND_TOOL_NAMES:
        tool = TOOLS.get(name)()
        schema = tool.schema()
        assert tool.name == name == schema["function"]["name"]
        assert schema["type"] == "function" and schema["function"]["description"]
        assert schema["function"]["parameters"]["additionalProperties"] is False


def test_build_tools_rejects_unknown_names():
    assert list(build_tools(["translate_text", "calculate_math"])) == ["translate_text", "calculate_math"]
    with pytest.raises(ConfigError, match="unknown tool 'calculator'"):
        build_tools(["calculator"])


# -- the six tools ------------------------------------------------------------------------------


def test_calculate_math(executor):
    assert run_tool(executor, "calculate_math", expression="256 * 37") == {"result": "9472"}
    assert run_tool(executor, "calculate_math", expression="1 / 3") == {"result": "0.3333"}
    assert run_tool(executor, "calculate_math", expression="(2 + 3) * 4 / 8") == {"result": "2.5"}


@pytest.mark.parametrize(
    ("value", "from_unit", "to_unit", "expected"),
    [
        (5, "mile", "km", "8.05"),
        (100, "C", "F", "212"),
        (32, "F", "C", "0"),
        (0, "C", "K", "273.15"),
        (2, "kg", "lb", "4.41"),
        (1.5, "km", "m", "1500"),
        (12, "inch", "ft", "1"),
    ],
)
def test_unit_converter(executor, value, from_unit, to_unit, expected):
    result = run_tool(executor, "unit_converter", value=value, from_unit=from_unit, to_unit=to_unit)
    assert result == {"result": expected, "unit": to_unit}


def test_unit_converter_refuses_mixed_dimensions(executor):
    result = executor.execute(ToolCall("c", "unit_converter", {"value": 1, "from_unit": "kg", "to_unit": "km"}))
    assert result.status == "error" and "cannot convert mass" in result.content


def test_weather_is_deterministic_per_city(executor):
    paris = run_tool(executor, "get_current_weather", city="Paris")
    assert paris == run_tool(executor, "get_current_weather", city="Paris")
    assert run_tool(executor, "get_current_weather", city=" PARIS ")["temperature"] == paris["temperature"]
    assert paris == {"city": "Paris", "temperature": "31", "condition": "rainy"}
    temperatures = {int(run_tool(executor, "get_current_weather", city=f"town {i}")["temperature"]) for i in range(300)}
    assert min(temperatures) >= -5 and max(temperatures) <= 35 and len(temperatures) > 20
    assert executor.execute(ToolCall("c", "get_current_weather", {"city": "  "})).status == "error"


@pytest.mark.parametrize(
    ("timezone", "time"),
    [("UTC", "12:00"), ("Asia/Tokyo", "21:00"), ("Asia/Kolkata", "17:30"), ("America/Los_Angeles", "05:00")],
)
def test_time_comes_from_the_fixed_clock(executor, timezone, time):
    assert run_tool(executor, "get_current_time", timezone=timezone) == {"timezone": timezone, "time": time}


def test_exchange_rate(executor):
    assert run_tool(executor, "get_exchange_rate", from_currency="USD", to_currency="EUR") == {"rate": "0.92"}
    assert run_tool(executor, "get_exchange_rate", from_currency="USD", to_currency="JPY") == {"rate": "157"}
    assert run_tool(executor, "get_exchange_rate", from_currency="EUR", to_currency="USD") == {"rate": "1.087"}
    same = executor.execute(ToolCall("c", "get_exchange_rate", {"from_currency": "GBP", "to_currency": "GBP"}))
    assert same.status == "error" and "ToolError" in same.content


def test_translate_text(executor):
    assert run_tool(executor, "translate_text", text="Thank you!", target_language="German") == {"translation": "danke"}
    assert run_tool(executor, "translate_text", text="WATER", target_language="French") == {"translation": "eau"}
    unknown = executor.execute(ToolCall("c", "translate_text", {"text": "spaceship", "target_language": "French"}))
    assert unknown.status == "error" and "fixed vocabulary" in unknown.content


def test_minimind_spellings_run_as_our_own(executor):
    """MiniMind's `location`, its optional time zone and its unit names mean what ours do."""
    assert run_tool(executor, "get_current_weather", location="Paris") == run_tool(
        executor, "get_current_weather", city="Paris"
    )
    assert run_tool(executor, "get_current_time") == run_tool(executor, "get_current_time", timezone="Asia/Shanghai")
    pairs = [
        ("miles", "mile", "km"),
        ("pounds", "lb", "kg"),
        ("meters", "m", "ft"),
        ("feet", "ft", "m"),
        ("KM", "km", "m"),
    ]
    for minimind, ours, to_unit in pairs:
        assert (
            run_tool(executor, "unit_converter", value=3, from_unit=minimind, to_unit=to_unit)["result"]
            == (run_tool(executor, "unit_converter", value=3, from_unit=ours, to_unit=to_unit)["result"])
        )
    assert run_tool(executor, "unit_converter", value=100, from_unit="Celsius", to_unit="fahrenheit") == {
        "result": "212",
        "unit": "fahrenheit",
    }


@pytest.mark.parametrize(
    ("name", "arguments", "told"),
    [
        ("get_current_weather", {"location": "Paris", "city": "Paris"}, "unexpected argument 'location'"),
        ("get_current_weather", {}, "missing required argument 'city'"),
        ("get_current_weather", {"location": 5}, "missing required argument 'city'; unexpected argument 'location'"),
        ("get_current_time", {"timezone": 5}, "argument 'timezone' must be of type string, got number"),
        ("get_current_time", {"zone": "UTC"}, "missing required argument 'timezone'; unexpected argument 'zone'"),
    ],
)
def test_arguments_no_spelling_accepts_are_checked_against_the_tools_own_schema(executor, name, arguments, told):
    result = executor.execute(ToolCall("c", name, arguments))
    assert result.status == "bad_arguments"
    assert json.loads(result.content) == {"error": f"bad arguments for '{name}': {told}"}


def test_minimind_unit_names_outside_its_table_are_still_unknown(executor):
    result = executor.execute(ToolCall("c", "unit_converter", {"value": 1, "from_unit": "c", "to_unit": "F"}))
    assert result.status == "error" and "unknown unit 'c'" in result.content


def test_minimind_rows_run_as_written(executor):
    """Every reference call of the MiniMind-format rows (all six tools, MiniMind's spellings) runs, gives the
    row's tool message, and the reference answer states every gt value."""
    tasks = load_jsonl(MINIMIND_ROWS, max_row_bytes=10**6)
    assert {call["function"]["name"] for task in tasks for call in _reference_calls(task)} == set(MINIMIND_TOOL_NAMES)
    for task in tasks:
        told = [json.loads(m["content"]) for m in task.reference if m["role"] == "tool"]
        results = [
            executor.execute(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]))
            for c in (_reference_calls(task))
        ]
        assert [r.status for r in results] == ["ok"] * len(told), [r.content for r in results]
        assert [json.loads(r.content) for r in results] == told
        assert all(value in task.reference[-1]["content"] for value in task.gt)


def _reference_calls(task) -> list[dict]:
    return [call for m in task.reference for call in m.get("tool_calls", [])]


def test_tools_raise_tool_error_when_called_directly():
    with pytest.raises(ToolError):
        TOOLS.get("get_exchange_rate")().run({"from_currency": "USD", "to_currency": "USD"})


# -- the executor -------------------------------------------------------------------------------


class Blocking(Tool):
    """Test-only tool that waits for an event, to exercise the timeout."""

    name = "blocking"
    description = "waits"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def __init__(self) -> None:
        self.release = threading.Event()

    def run(self, arguments: dict) -> dict:
        self.release.wait(10)
        return {}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class Faulty(Tool):
    name = "faulty"
    description = "fails or floods"
    parameters = {"type": "object", "properties": {"mode": {"type": "string"}}, "additionalProperties": False}

    def run(self, arguments: dict) -> dict:
        outcomes = {
            "crash": lambda: 1 / 0,
            "exit": lambda: sys.exit(3),
            "flood": lambda: {"text": "x" * 10_000},
            "set": lambda: {"value": {1, 2}},
            "unprintable": lambda: (_ for _ in ()).throw(Unprintable()),
        }
        return outcomes[arguments["mode"]]()


def test_unknown_tool_names_the_available_ones(executor):
    result = executor.execute(ToolCall("call_3", "search_web", {"q": "x"}))
    assert result.status == "unknown_tool" and not result.valid_call
    assert "unknown tool 'search_web'" in result.content and "calculate_math" in result.content


def test_tools_outside_the_allowed_list_are_unknown(executor):
    result = executor.execute(ToolCall("c", "calculate_math", {"expression": "1+1"}), allowed=["translate_text"])
    assert result.status == "unknown_tool"
    assert json.loads(result.content) == {"error": "unknown tool 'calculate_math'; available tools: translate_text"}
    allowed = executor.execute(ToolCall("c", "calculate_math", {"expression": "1+1"}), allowed={"calculate_math"})
    assert allowed.status == "ok"


def test_bad_arguments_are_listed(executor):
    result = executor.execute(ToolCall("c", "unit_converter", {"value": "5", "from_unit": "mile", "to": "km"}))
    assert result.status == "bad_arguments" and not result.valid_call
    message = json.loads(result.content)["error"]
    assert "'value' must be of type number" in message
    assert "missing required argument 'to_unit'" in message and "unexpected argument 'to'" in message


def test_exceptions_become_error_results():
    executor = ToolExecutor({"faulty": Faulty()}, timeout_s=2.0, max_output_chars=2048)
    crash = executor.execute(ToolCall("c", "faulty", {"mode": "crash"}))
    assert crash.status == "error" and crash.valid_call
    assert json.loads(crash.content) == {"error": "ZeroDivisionError: division by zero"}
    assert executor.execute(ToolCall("c", "faulty", {"mode": "exit"})).status == "error"
    assert executor.execute(ToolCall("c", "faulty", {"mode": "set"})).content.startswith('{"error": "TypeError')
    unprintable = executor.execute(ToolCall("c", "faulty", {"mode": "unprintable"}))  # not a timeout
    assert unprintable.status == "error" and "Unprintable" in unprintable.content


def test_output_is_capped_with_a_marker():
    executor = ToolExecutor({"faulty": Faulty()}, timeout_s=2.0, max_output_chars=300)
    result = executor.execute(ToolCall("c", "faulty", {"mode": "flood"}))
    assert result.status == "ok" and len(result.content) <= 300
    kept = re.fullmatch(r'(\{"text": "x+)\.\.\.\[truncated (\d+) chars\]', result.content)
    assert kept and len(kept.group(1)) + int(kept.group(2)) == len(json.dumps({"text": "x" * 10_000}))


def test_slow_calls_time_out_concurrently():
    blocking = Blocking()
    executor = ToolExecutor({"blocking": blocking}, timeout_s=0.2, max_output_chars=2048)
    started = time.perf_counter()
    try:
        results = executor.execute_many([ToolCall("a", "blocking", {}), ToolCall("b", "blocking", {})])
    finally:
        blocking.release.set()
    assert time.perf_counter() - started < 0.35  # both waited at once
    assert [r.status for r in results] == ["timeout", "timeout"] and all(r.valid_call for r in results)
    assert "timed out after 0.2 s" in results[0].content and results[0].latency_s >= 0.2


class Meeting(Tool):
    """Test-only tool whose calls wait for one another: `parties` of them return ok only when that many run at once
    (a threading.Barrier), and its peak count of calls running together is recorded."""

    name = "meeting"
    description = "waits for the others"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=5)
        self.lock, self.running, self.peak = threading.Lock(), 0, 0

    def run(self, arguments: dict) -> dict:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.running -= 1
        return {"met": True}


def test_a_batch_runs_the_calls_of_several_trajectories_together_within_the_concurrency_cap():
    meeting = Meeting(parties=3)
    executor = ToolExecutor({"meeting": meeting}, timeout_s=8.0, max_output_chars=2048, max_concurrent=3)
    requests = [([ToolCall(f"t{i}", "meeting", {})], None, None) for i in range(6)]  # six trajectories, a call each
    results = executor.execute_batch(requests)
    assert [[r.status for r in rs] for rs in results] == [["ok"]] * 6  # two meetings of three: they overlapped
    assert meeting.peak == 3  # never more than max_concurrent at once
    assert [rs[0].call_id for rs in results] == [f"t{i}" for i in range(6)]


class Sleepy(Tool):
    name = "sleepy"
    description = "sleeps 0.6 s"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def run(self, arguments: dict) -> dict:
        time.sleep(0.6)
        return {}


def test_a_call_waiting_for_a_slot_has_its_whole_timeout_once_it_starts():
    executor = ToolExecutor({"sleepy": Sleepy()}, timeout_s=1.0, max_output_chars=2048, max_concurrent=1)
    first, second, refused = executor.execute_batch(
        [([ToolCall(f"t{i}", "sleepy", {})], None, None) for i in range(2)]
        + [([ToolCall("t2", "sleepy", {})], None, 0)]
    )
    # one slot: the second call starts when the first ends (0.6 s in) and ends 1.2 s after the batch began, past a
    # timeout counted from the batch's start but within its own
    assert first[0].status == second[0].status == "ok"
    assert refused[0].status == "over_budget"  # a request's budget holds in a batch


class Counted(Tool):
    """Test-only tool that counts the calls that started and takes 0.3 s each."""

    name = "counted"
    description = "counts its calls"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def __init__(self) -> None:
        self.lock, self.started = threading.Lock(), 0

    def run(self, arguments: dict) -> dict:
        with self.lock:
            self.started += 1
        time.sleep(0.3)
        return {}


def test_an_error_in_the_pools_block_cancels_the_calls_not_yet_started():
    """The submitter fails (an agent loop's decoding, say) with calls queued for the one slot: the running call
    ends, the queued ones never start, so the error comes out without waiting for them."""
    counted = Counted()
    executor = ToolExecutor({"counted": counted}, timeout_s=5.0, max_output_chars=2048, max_concurrent=1)
    with pytest.raises(RuntimeError, match="decoding failed"), executor.pool() as pool:
        pending = [pool.submit(([ToolCall(f"t{i}", "counted", {})], None, None)) for i in range(5)]
        raise RuntimeError("decoding failed")
    assert counted.started <= 1
    assert all(calls.futures()[0].cancelled() for calls in pending[1:])


def test_execute_many_keeps_call_order(executor):
    calls = [
        ToolCall("call_0", "get_current_time", {"timezone": "UTC"}),
        ToolCall("call_1", "nope", {}),
        ToolCall("call_2", "calculate_math", {"expression": "2 ** 5"}),
    ]
    results = executor.execute_many(calls)
    assert [r.call_id for r in results] == ["call_0", "call_1", "call_2"]
    assert [r.status for r in results] == ["ok", "unknown_tool", "ok"]


def test_result_to_message():
    result = ToolResult(call_id="call_1", name="calculate_math", content='{"result": "4"}', status="ok", latency_s=0.1)
    assert result.to_message() == {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "calculate_math",
        "content": '{"result": "4"}',
    }


def test_tools_the_tasks_offer_must_be_tools_the_executor_runs():
    offered = [tool.schema() for tool in build_tools(["calculate_math", "unit_converter"]).values()]
    check_offered_tools(offered, ["unit_converter", "calculate_math", "translate_text"])  # more is fine
    check_offered_tools([], [])
    with pytest.raises(ConfigError, match=r"^tools.names: the tasks offer unit_converter, which tools.names "):
        check_offered_tools(offered, ["calculate_math"])


def test_minimind_schemas_pass_the_start_up_check():
    """A row offering MiniMind's TOOLS verbatim (`location`, an optional time zone) runs on our tools."""
    check_offered_tools(minimind_tools(), MINIMIND_TOOL_NAMES)
    weather = next(t for t in minimind_tools() if t["function"]["name"] == "get_current_weather")
    weather["function"]["parameters"]["properties"] = {"place": {"type": "string"}}
    weather["function"]["parameters"]["required"] = ["place"]
    checked = r'checks \{.*"city".*\} or \{.*"location".*\}; fix the data'
    with pytest.raises(ConfigError, match=checked):
        check_offered_tools([weather], MINIMIND_TOOL_NAMES)


def test_a_tool_the_tasks_offer_with_other_arguments_than_it_checks_is_refused():
    (shown,) = [tool.schema() for tool in build_tools(["calculate_math"]).values()]
    reworded = json.loads(json.dumps(shown))
    reworded["function"]["description"] = "Another description."
    reworded["function"]["parameters"]["properties"]["expression"]["description"] = "Arithmetic."
    check_offered_tools([reworded], ["calculate_math"])  # the same interface in other words
    for change in (
        lambda p: p["properties"].update(foo={"type": "integer"}),  # an argument the tool does not take
        lambda p: p["properties"]["expression"].update(type="number"),  # another type
        lambda p: p.update(required=[]),  # the expression made optional
    ):
        other = json.loads(json.dumps(shown))
        change(other["function"]["parameters"])
        with pytest.raises(ConfigError, match=r"^tools.names: the tasks offer calculate_math with parameters "):
            check_offered_tools([other], ["calculate_math"])
