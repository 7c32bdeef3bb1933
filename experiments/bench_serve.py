"""Throughput and latency of `python -m minirl.serve` under concurrent tool-calling chats.

    python experiments/bench_serve.py [--model PATH] [--requests 50] [--clients 10] [--max-tokens 96]
                                      [--max-batch-size 16]

Starts the server (default: the embedded tiny model, `model=tiny`; `--model PATH` serves a checkpoint) on
a free loopback port, then sends the prompts of the held-out synthetic tool tasks (train_heldout_split,
with their tools) as greedy chat requests through the openai client, from `--clients` threads at once:
first as whole responses, then with stream=true. Prints a Markdown table: failed requests, requests/s,
completion tokens/s, p50/p95 latency and, streamed, p50/p95 time to the first chunk that carries text or
a call (a turn that calls tools sends its calls whole, when the turn ends).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai

from minirl.data.synthetic_tools import train_heldout_split
from minirl.data.task import Task
from minirl.serving.launch import launch_server


@dataclass
class Outcome:
    latency_s: float
    first_text_s: float | None  # streamed only: when the first chunk with text or a call arrived
    completion_tokens: int
    error: str | None = None


def send(client: openai.OpenAI, model_id: str, task: Task, max_tokens: int, stream: bool) -> Outcome:
    request = {"model": model_id, "messages": task.messages, "tools": task.tools, "temperature": 0}
    started = time.perf_counter()
    try:
        if not stream:
            response = client.chat.completions.create(**request, max_tokens=max_tokens)
            return Outcome(time.perf_counter() - started, None, response.usage.completion_tokens)
        first_text_s, tokens = None, 0
        chunks = client.chat.completions.create(
            **request, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}
        )
        for chunk in chunks:
            delta = chunk.choices[0].delta if chunk.choices else None
            carries = delta and (delta.content or delta.tool_calls or getattr(delta, "reasoning_content", None))
            if first_text_s is None and carries:
                first_text_s = time.perf_counter() - started
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return Outcome(time.perf_counter() - started, first_text_s, tokens)
    except openai.APIError as err:
        return Outcome(time.perf_counter() - started, None, 0, f"{type(err).__name__}: {err}")


def measure(client: openai.OpenAI, model_id: str, tasks: list[Task], clients: int, max_tokens: int, stream: bool):
    send(client, model_id, tasks[0], max_tokens, stream)  # warm-up, not counted
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(lambda task: send(client, model_id, task, max_tokens, stream), tasks))
    wall_s = time.perf_counter() - started
    ok = [o for o in outcomes if o.error is None]
    for outcome in outcomes:
        if outcome.error:
            print(f"failed: {outcome.error}")
    latency = np.percentile([o.latency_s for o in ok], [50, 95]) if ok else [float("nan")] * 2
    first = [o.first_text_s for o in ok if o.first_text_s is not None]
    first_text = np.percentile(first, [50, 95]) if first else None
    cells = [
        "stream" if stream else "whole",
        f"{len(outcomes) - len(ok)}/{len(outcomes)}",
        f"{len(ok) / wall_s:.1f}",
        f"{sum(o.completion_tokens for o in ok) / wall_s:.0f}",
        f"{latency[0]:.2f} / {latency[1]:.2f}",
        f"{first_text[0]:.2f} / {first_text[1]:.2f}" if first_text is not None else "-",
    ]
    print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory or hub id (default: model=tiny)")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--clients", type=int, default=10, help="client threads sending at once")
    parser.add_argument("--max-tokens", type=int, default=96, help="per reply (rollout.max_new_tokens)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="serve.max_batch_size: rows decoded together")
    args = parser.parse_args()
    _, tasks = train_heldout_split(1, args.requests, seed=0)
    model = [f"model.name_or_path={args.model}"] if args.model else ["model=tiny"]
    overrides = ["serve.host=127.0.0.1", "serve.port=0", f"serve.max_batch_size={args.max_batch_size}", *model]
    with tempfile.TemporaryDirectory() as run_dir:
        # the first use of the tiny model builds and warm-starts it: allow for that
        server = launch_server(overrides, Path(run_dir), timeout_s=3600)
        try:
            client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=600)
            threads = os.environ.get("OMP_NUM_THREADS", "unset")
            setting = (
                f"{len(tasks)} requests from {args.clients} clients, greedy, max_tokens {args.max_tokens}, "
                f"max_batch_size {args.max_batch_size}"
            )
            print(f"{server.model_id}: {setting}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={threads}\n")
            print("| responses | failed | requests/s | tokens/s | latency p50 / p95 (s) | first text p50 / p95 (s) |")
            print("| --- | --- | --- | --- | --- | --- |")
            for stream in (False, True):
                measure(client, server.model_id, tasks, args.clients, args.max_tokens, stream)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
