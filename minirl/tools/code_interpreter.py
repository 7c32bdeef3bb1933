"""The `code_interpreter` tool (ReTool): model-written Python, run in a fresh contained interpreter.

    {"name": "code_interpreter", "arguments": {"code": "print((7 - 1) / 2)"}}  ->  {"output": "3.0\\n"}

Each call is a new process (`minirl.tools.sandbox`, standard library only): no variable or file
survives between calls. At most `tools.sandbox.workers` runs go at once; a call that waits for a
free worker spends its own time doing so. A run is killed at 90% of `tools.timeout_s` after its
call started, so the executor's timeout never fires first and the model still sees what was
printed before the kill.

What the model reads (the executor JSON-encodes it):

- the code finished: status "ok", `{"output": stdout + stderr}`, or "[no output]" if both are empty;
- an uncaught exception: status "error", `{"error": "ToolError: " + stdout + traceback}`; the
  traceback starts at the model's own code (`File "main.py", line 3, in <module>`);
- a timeout: status "timeout", the output so far, then "[killed: wall-clock limit of 1.8 s reached]"
  (or "[killed: CPU time limit of 5 s reached]");
- another resource kill: status "error", likewise ending e.g. "[killed by signal SIGSEGV]".
  Running out of memory is usually a MemoryError traceback instead, and printing or writing past
  the file size limit an `OSError: [Errno 27] File too large` one (CPython ignores SIGXFSZ),
  after the start of what was printed;
- any other failing exit with nothing on stderr: "[exit status N]".

stdout keeps its start and stderr its end, within `tools.sandbox.max_output_chars` together, with
a visible marker where cut. Every chat-template control token in the text (`CONTROL_TOKENS`) gets
a zero-width space after its first character: it reads the same but is no longer the token, so
printed text cannot close the tool turn or forge a call.
"""

from __future__ import annotations

import re
import signal
import threading
import time

from minirl.config import SandboxConfig, ToolsConfig
from minirl.errors import ConfigError
from minirl.tools.base import TOOLS, Tool, ToolError, ToolTimeout
from minirl.tools.sandbox import SandboxRun, namespace_prefix, run_python

KILL_AT = 0.9  # share of tools.timeout_s after which a run is killed; the rest covers kill and cleanup

CONTROL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
)
_CONTROL = re.compile("|".join(map(re.escape, CONTROL_TOKENS)))
_ZERO_WIDTH_SPACE = "\u200b"


def neutralise(text: str) -> str:
    """`text` with a zero-width space after the first character of every control token in it."""
    return _CONTROL.sub(lambda m: m[0][0] + _ZERO_WIDTH_SPACE + m[0][1:], text)


def _why_stopped(run: SandboxRun, limits: SandboxConfig, timeout_s: float) -> str:
    """A bracketed note when the run did not end by itself, or ended badly with nothing on stderr."""
    if run.timed_out:
        return f"[killed: wall-clock limit of {timeout_s:.3g} s reached]"
    if run.killed_by == signal.SIGXCPU:
        return f"[killed: CPU time limit of {limits.cpu_s} s reached]"
    if run.killed_by is not None:
        name = signal.Signals(run.killed_by).name if run.killed_by in signal.valid_signals() else run.killed_by
        return f"[killed by signal {name}]"
    if run.exit_code and not run.stderr_bytes:
        return f"[exit status {run.exit_code}]"
    return ""


def _observation(run: SandboxRun, limits: SandboxConfig, timeout_s: float) -> str:
    """The text the model reads for one run (see the module docstring)."""
    note = _why_stopped(run, limits, timeout_s)
    separator = "\n" if note and run.output and not run.output.endswith("\n") else ""
    return neutralise(run.output + separator + note) or "[no output]"


@TOOLS.register("code_interpreter")
class CodeInterpreter(Tool):
    name = "code_interpreter"
    description = (
        "Run Python code (standard library only) in a fresh interpreter and return what it prints. "
        "Calls are independent: define everything you use and print the values you need."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to be executed."}},
        "required": ["code"],
        "additionalProperties": False,
    }

    @classmethod
    def check_config(cls, cfg: ToolsConfig) -> None:
        if not namespace_prefix() and not cfg.sandbox.allow_unconfined:
            raise ConfigError(
                "tools.sandbox.allow_unconfined: code_interpreter runs model-written code, and this machine refuses "
                "the unprivileged user namespaces that give each run a root of its own (no trainer files, no "
                "network); without them only an audit hook inside the code's own process keeps it in, which "
                "deliberate code can switch off. Allow them (e.g. sysctl kernel.unprivileged_userns_clone=1, "
                "or a container runtime that permits unshare), or accept the risk with "
                "tools.sandbox.allow_unconfined=true"
            )

    def __init__(self, cfg: ToolsConfig | None = None) -> None:
        if cfg is None:
            cfg = ToolsConfig()
        self.check_config(cfg)
        self.limits = cfg.sandbox
        self.budget_s = KILL_AT * cfg.timeout_s
        self._workers = threading.BoundedSemaphore(cfg.sandbox.workers)

    def run(self, arguments: dict) -> dict:
        deadline = time.monotonic() + self.budget_s
        if not self._workers.acquire(timeout=self.budget_s):
            raise ToolError(f"[not run: no sandbox worker was free within {self.budget_s:.3g} s]")
        try:
            timeout_s = deadline - time.monotonic()
            run = run_python(arguments["code"], self.limits, timeout_s)
        finally:
            self._workers.release()
        text = _observation(run, self.limits, timeout_s)
        if run.timed_out or run.killed_by == signal.SIGXCPU:
            raise ToolTimeout(text)
        if run.exit_code:
            raise ToolError(text)
        return {"output": text}
