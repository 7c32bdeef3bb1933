"""Tools the policy may call; importing this package registers MiniMind's six mock tools and the
sandboxed `code_interpreter`, and `@tool` registers a plain function as one more."""

from minirl.tools import code_interpreter, minimind
from minirl.tools.base import TOOLS, Tool, ToolError, ToolResult, build_tools
from minirl.tools.executor import ToolExecutor
from minirl.tools.function_tool import tool
from minirl.tools.minimind import MINIMIND_TOOL_NAMES
from minirl.tools.schema import validate_arguments

__all__ = [
    "MINIMIND_TOOL_NAMES",
    "TOOLS",
    "Tool",
    "ToolError",
    "ToolExecutor",
    "ToolResult",
    "build_tools",
    "code_interpreter",
    "minimind",
    "tool",
    "validate_arguments",
]
