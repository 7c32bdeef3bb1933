"""User-defined tools: schemas from signatures and docstrings, calls through the real executor,
selection from a composed config through `imports`, and the README's example, run as written."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Literal, Optional, Union

import pytest
from hydra import compose, initialize_config_dir

from minirl.config import Config, register_configs, to_config
from minirl.entry import CONF_DIR
from minirl.errors import ConfigError
from minirl.tools import TOOLS, ToolError, ToolExecutor, build_tools, tool
from minirl.tools.base import ToolCall
from minirl.validate import validate

pytestmark = pytest.mark.fast

register_configs()
README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(autouse=True)
def scratch_registry(monkeypatch):
    """Tools a test registers vanish after it, so the registry keeps matching conf/tools."""
    monkeypatch.setattr(TOOLS, "_entries", dict(TOOLS._entries))


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A folder on sys.path; the modules a test writes there are forgotten after it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for path in tmp_path.glob("*.py"):
        sys.modules.pop(path.stem, None)


def compose_cfg(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=list(overrides)))


def call(name: str, **arguments):
    """The ToolResult of one call through the real executor."""
    executor = ToolExecutor(build_tools([name]), timeout_s=2.0, max_output_chars=2048)
    return executor.execute(ToolCall("call_0", name, arguments))


# -- schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list, {"type": "array"}),
        (List, {"type": "array"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (List[list[str]], {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}),
        (dict, {"type": "object"}),
        (Dict, {"type": "object"}),
        (Optional[float], {"type": "number"}),
        (Union[None, str], {"type": "string"}),
        (int | None, {"type": "integer"}),
        (Literal["m", "km"], {"type": "string", "enum": ["m", "km"]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (Literal["any", 0], {"enum": ["any", 0]}),
        (Optional[Literal["C", "F"]], {"type": "string", "enum": ["C", "F"]}),
    ],
)
def test_schema_of_each_type_hint(hint, schema):
    def probe(x):
        """Probe."""

    probe.__annotations__ = {"x": hint}
    tool(probe)
    assert TOOLS.get("probe")().parameters == {
        "type": "object",
        "properties": {"x": schema},
        "required": ["x"],
        "additionalProperties": False,
    }


def test_schema_from_signature_and_docstring():
    @tool
    def convert(value: float, to_unit: Literal["m", "km"], *, digits: int = 2, note: Optional[str] = None) -> dict:
        """Convert a length
        between units.

        Longer notes stay out of the description.

        Args:
            value: the length to convert,
                in any unit.
            to_unit (str): the unit to convert to.
            digits: rounding.

        Returns:
            value: not an argument.
        """

    converter = TOOLS.get("convert")()
    assert converter.name == "convert" and converter.description == "Convert a length between units."
    assert converter.schema()["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "value": {"type": "number", "description": "the length to convert, in any unit."},
            "to_unit": {"type": "string", "enum": ["m", "km"], "description": "the unit to convert to."},
            "digits": {"type": "integer", "description": "rounding."},
            "note": {"type": "string"},
        },
        "required": ["value", "to_unit"],
        "additionalProperties": False,
    }


def test_name_description_and_parameters_given_explicitly():
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @tool(name="search_notes", description="Search my notes.", parameters=parameters)
    def search(**arguments):
        return {"hits": [arguments["q"]]}

    searcher = TOOLS.get("search_notes")()
    assert (searcher.name, searcher.description) == ("search_notes", "Search my notes.")
    assert searcher.parameters == parameters
    assert search(q="x") == {"hits": ["x"]}  # the decorator returns the function unchanged
    assert json.loads(call("search_notes", q="tea").content) == {"hits": ["tea"]}


@pytest.mark.parametrize(
    ("hint", "shown"),
    [
        (tuple[int, int], "tuple[int, int]"),
        (dict[str, int], "dict[str, int]"),
        (set, "set"),
        (Union[int, str], "Union[int, str]"),
        (list[bytes], "bytes"),
        (Literal[None], "Literal[None]"),
    ],
)
def test_unsupported_type_hints_fail_at_decoration(hint, shown):
    def area(size):
        """Area."""

    area.__annotations__ = {"size": hint}
    with pytest.raises(TypeError, match=rf"area: parameter 'size' has unsupported type hint .*{re.escape(shown)}"):
        tool(area)
    assert "area" not in TOOLS


def test_signatures_without_a_schema_fail_at_decoration():
    def untyped(text):
        """Untyped."""

    def variadic(*words: str):
        """Variadic."""

    def undocumented(text: str):
        pass

    with pytest.raises(TypeError, match="untyped: parameter 'text' has no type hint"):
        tool(untyped)
    with pytest.raises(TypeError, match="variadic: parameter 'words' is variadic positional"):
        tool(variadic)
    with pytest.raises(ValueError, match="undocumented: no description"):
        tool(undocumented)
    with pytest.raises(ValueError, match="parameters= must be a JSON schema of type object"):
        tool(parameters={"type": "string"})(untyped)
    with pytest.raises(TypeError, match="keyword arguments"):
        tool("a_name")


def test_a_name_registered_twice_raises():
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    with pytest.raises(ValueError, match="tool 'echo' is registered twice"):
        tool(echo)
    with pytest.raises(ValueError, match="tool 'calculate_math' is registered twice"):
        tool(name="calculate_math")(echo)


# -- calls through the executor -----------------------------------------------------------------


def test_results_become_tool_results():
    @tool
    def repeat(text: str, times: int = 2) -> str:
        """Repeat a text."""
        return text * times

    @tool
    def stats(numbers: list[float]) -> dict:
        """Sum and count numbers."""
        return {"sum": sum(numbers), "count": len(numbers)}

    ok = call("repeat", text="ab", times=3)
    assert ok.status == "ok" and json.loads(ok.content) == {"result": "ababab"}
    assert json.loads(call("repeat", text="ab").content) == {"result": "abab"}
    assert json.loads(call("repeat", text="ab", times=2.0).content) == {"result": "abab"}  # 2.0 passes as int 2
    assert json.loads(call("stats", numbers=[1, 2.5]).content) == {"sum": 3.5, "count": 2}


def test_bad_arguments_are_refused_before_the_call():
    calls = []

    @tool
    def shout(text: str, volume: Literal["loud", "louder"] = "loud") -> str:
        """Shout a text."""
        calls.append(text)
        return text.upper()

    for arguments, fragment in [
        ({"text": 3}, "argument 'text' must be of type string, got number"),
        ({}, "missing required argument 'text'"),
        ({"text": "a", "volume": "soft"}, "argument 'volume' must be one of: loud, louder"),
        ({"text": "a", "pitch": 1}, "unexpected argument 'pitch'"),
    ]:
        result = call("shout", **arguments)
        assert result.status == "bad_arguments" and fragment in json.loads(result.content)["error"]
    assert calls == []


def test_exceptions_become_error_observations():
    @tool
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        if b == 0:
            raise ToolError("b must not be 0")
        return a / b

    @tool
    def broken(mode: str) -> object:
        """Fail."""
        return {1, 2} if mode == "set" else int(mode)

    refused = call("divide", a=1, b=0)
    assert refused.status == "error" and refused.valid_call
    assert json.loads(refused.content) == {"error": "ToolError: b must not be 0"}
    crashed = call("broken", mode="x")
    assert crashed.status == "error" and json.loads(crashed.content)["error"].startswith("ValueError: invalid literal")
    assert json.loads(call("broken", mode="set").content)["error"].startswith("TypeError")  # not JSON


# -- selection from config ----------------------------------------------------------------------

USER_MODULE = '''
from minirl.tools import tool


@tool
def shout(text: str) -> str:
    """Shout a text."""
    return text.upper() + "!"
'''


def test_tools_imports_registers_and_tools_names_selects(module_dir):
    (module_dir / "shouting_tools.py").write_text(USER_MODULE)
    cfg = compose_cfg("imports=[shouting_tools]", "tools.names=[shout,calculate_math]")
    assert "shout" not in TOOLS
    validate(cfg)
    validate(cfg)  # the module is imported once: no second registration
    executor = ToolExecutor(build_tools(cfg.tools.names), cfg.tools.timeout_s, cfg.tools.max_output_chars)
    assert json.loads(executor.execute(ToolCall("c", "shout", {"text": "hi"})).content) == {"result": "HI!"}


def test_imports_default_to_none():
    assert compose_cfg().imports == []


def test_a_failed_import_names_the_module_and_the_key(module_dir):
    missing = "imports: cannot import 'no_such_tools': ModuleNotFoundError.*PYTHONPATH"
    with pytest.raises(ConfigError, match=missing):
        validate(compose_cfg("imports=[no_such_tools]"))
    (module_dir / "bad_tools.py").write_text(USER_MODULE.replace("text: str", "text: bytes"))
    with pytest.raises(ConfigError, match="imports: cannot import 'bad_tools': TypeError: .*'text'.*bytes"):
        validate(compose_cfg("imports=[bad_tools]", "tools.names=[shout]"))


# -- the README example -------------------------------------------------------------------------


def readme_example() -> tuple[str, str]:
    """The python block and the command line right under the README's "Adding a tool" heading."""
    section = README.read_text().split("\n## Adding a tool\n", 1)[1].split("\n## ", 1)[0]
    code, command = re.findall(r"```(?:python|bash)\n(.*?)```", section, re.S)[:2]
    return code, command.strip()


def test_the_readme_example_runs_as_written(module_dir):
    code, command = readme_example()
    module = re.match(r"# (\w+)\.py\n", code).group(1)
    (module_dir / f"{module}.py").write_text(code)
    overrides = shlex.split(command)
    assert overrides[:3] == ["python", "-m", "minirl.train"]
    cfg = compose_cfg(*overrides[3:])
    validate(cfg)
    executor = ToolExecutor(build_tools(cfg.tools.names), cfg.tools.timeout_s, cfg.tools.max_output_chars)
    schema = executor.tools["word_count"].schema()["function"]
    assert schema["description"] == "Count the words in a text."
    assert schema["parameters"]["required"] == ["text"] and schema["parameters"]["properties"]["unique"] == {
        "type": "boolean",
        "description": "count each distinct word once.",
    }
    counted = executor.execute(ToolCall("c", "word_count", {"text": "to be or not to be", "unique": True}))
    assert counted.status == "ok" and json.loads(counted.content) == {"result": 4}
