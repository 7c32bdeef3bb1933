"""Tools the policy may call; importing this package registers MiniMind's six mock tools."""

from minirl.tools import minimind
from minirl.tools.base import TOOLS, Tool, ToolError, ToolExecutor, ToolResult, build_tools, validate_arguments
from minirl.tools.minimind import MINIMIND_TOOL_NAMES

__all__ = [
    "MINIMIND_TOOL_NAMES",
    "TOOLS",
    "Tool",
    "ToolError",
    "ToolExecutor",
    "ToolResult",
    "build_tools",
    "minimind",
    "validate_arguments",
]
