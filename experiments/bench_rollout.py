"""Rollout time of the engines that sample on the policy module itself: `hf` (`model.generate`) and
`torch` (a KV-cache loop that drops finished rows, prefills each distinct prompt once and reuses the
previous turn's keys and values).

    python experiments/bench_rollout.py [--model PATH] [--prompts 8] [--repeats 3]

One rollout is what a training step samples: `--prompts` training tasks x rollout.group_size samples,
through the multi-turn agent loop with the real tools, at the rollout temperature. The default model is
the warm-started embedded tiny model (built and cached on first use, as `python -m minirl.train` does).
Prints a Markdown table of the median seconds per rollout and the tokens each trajectory sampled.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra import compose, initialize_config_dir
from rich.console import Console

from minirl.bootstrap import model_path
from minirl.config import register_configs, to_config
from minirl.data import DATASETS
from minirl.entry import CONF_DIR
from minirl.models.loading import load_model, load_tokenizer
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.tools import ToolExecutor

ENGINE_NAMES = ("hf", "torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="hub id or local path (default: the embedded model)")
    parser.add_argument("--prompts", type=int, default=8, help="tasks per rollout")
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per engine (after one warm-up)")
    args = parser.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=[f"model.name_or_path={args.model}"]))
    path = model_path(cfg, Console(stderr=True))
    tokenizer = load_tokenizer(path, cfg)
    model = load_model(path, cfg, torch.device("cpu"), trainable=False)
    tasks = DATASETS.get(cfg.data.name)(cfg.data).train[: args.prompts]
    executor = ToolExecutor.from_config(cfg.tools)
    r = cfg.rollout
    limits = AgentLimits(r.max_turns, r.max_new_tokens, r.max_total_tokens, r.max_tool_calls)
    sampling = SamplingParams.from_config(r, r.temperature)
    print(f"{args.prompts} prompts x {r.group_size} samples, up to {r.max_turns} turns of {r.max_new_tokens} tokens\n")
    print("| engine | seconds per rollout | sampled tokens per trajectory, mean | max |")
    print("| --- | --- | --- | --- |")
    for name in ENGINE_NAMES:
        engine = ENGINES.get(name)(model, tokenizer, torch.device("cpu"))
        seconds, sampled = [], []
        for repeat in range(args.repeats + 1):
            torch.manual_seed(repeat)
            started = time.perf_counter()
            trajs = run_agent(engine, tokenizer, executor, tasks, r.group_size, limits, sampling, cfg.protocol)
            if repeat:  # the first rollout warms up
                seconds.append(time.perf_counter() - started)
                sampled += [sum(t.action_mask) for t in trajs]
        print(f"| {name} | {statistics.median(seconds):.2f} | {statistics.fmean(sampled):.1f} | {max(sampled)} |")


if __name__ == "__main__":
    main()
