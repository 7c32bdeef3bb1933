"""Start `python -m minirl.serve` as a child process and wait until it serves (tests, benchmarks).

env = {**os.environ, "MINIRL_API_KEY": key}  # its whole environment; default this one's
server = launch_server(["model.name_or_path=./ckpt", "serve.port=0"], run_dir, env=env)
openai.OpenAI(base_url=server.base_url, api_key=key).chat.completions.create(model=server.model_id, ...)
server.stop()
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

READY_LINE = re.compile(r"serving (.+) at (http://\S+/v1)")  # what minirl.serving.server prints when ready


@dataclass
class ServerProcess:
    process: subprocess.Popen
    base_url: str  # http://HOST:PORT/v1
    model_id: str  # what /v1/models lists and requests must name

    def stop(self, stop_signal: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send `stop_signal` and return the exit code; SIGKILL if it has not exited after `timeout_s`."""
        self.process.send_signal(stop_signal)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def launch_server(
    overrides: Sequence[str], run_dir: Path, timeout_s: float = 600.0, env: Mapping[str, str] | None = None
) -> ServerProcess:
    """`python -m minirl.serve overrides` with its Hydra run directory, stdout (server.out) and stderr
    (server.log) in `run_dir`, once it has printed its ready line; `env` is its whole environment (default
    this one's). Raises RuntimeError with the ends of both if it exits or is not ready within `timeout_s`
    (building the embedded tiny model on first use takes minutes)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log, out = run_dir / "server.log", run_dir / "server.out"
    command = [sys.executable, "-m", "minirl.serve", f"hydra.run.dir={run_dir}", *overrides]
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read_stdout() -> None:  # keeps draining after the ready line, so the server never blocks on a full pipe
        with out.open("w") as copy:
            for line in process.stdout:
                copy.write(line)
                copy.flush()
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read_stdout, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            process.kill()
            ends = "\n".join(f"the end of {path}:\n{path.read_text()[-3000:]}" for path in (out, log))
            raise RuntimeError(f"minirl.serve did not get ready; {ends}")
        if match := READY_LINE.fullmatch(line.strip()):
            return ServerProcess(process, base_url=match[2], model_id=match[1])
