"""Prefill tokens and rollout time against the number of turns, with and without KV reuse.

    python experiments/bench/turns.py [--rows 16] [--max-turns 8] [--repeats 3] [--out experiments/bench/results]

Token in, token out, on the bench's random-weight model (workload.py): ROWS conversations of random tokens,
each turn sampling up to NEW_TOKENS tokens (an end-of-turn token is as likely as any other, so few rows end
early) and then appending an OBSERVATION-token tool result, as the agent loop does; the next turn's prompt
is the whole conversation so far. Three ways to sample each turn:

- torch, KV reuse: minirl's torch engine; a turn's prefill encodes only what was appended since the last one
  (minirl.inference.decoding.PrefixStore);
- torch, no reuse: the same engine with its stored keys and values dropped before every turn, so each turn
  encodes the whole conversation again;
- hf generate: `model.generate` (what a MiniMind-style loop calls every turn), which also re-encodes it.

Prefill tokens are counted on the model's forward (calls that feed more than one token per row, padding
excluded). With reuse they grow linearly in the turns, without it quadratically. A point's seconds are the
median of --repeats runs after a warm-up, the three ways alternating in order from one repeat to the next; its
prefill tokens are the same in every run (the same seeds). Writes turns.json and turns.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import workload
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.rollout.engine import ENGINES, SamplingParams

HERE = Path(__file__).resolve().parent
NEW_TOKENS, OBSERVATION = 32, 48


class PrefillCounter:
    """Counts the tokens a model's forward encodes in calls that feed more than one token per row."""

    def __init__(self, model) -> None:
        self.tokens = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs) -> None:
        ids, attention = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is not None and ids.shape[1] > 1:
            self.tokens += int(attention[:, -ids.shape[1] :].sum()) if attention is not None else ids.numel()


def conversation_rollout(engine, counter: PrefillCounter, rows: int, turns: int, reuse: bool, seed: int) -> dict:
    """Sample `turns` turns of `rows` conversations; (seconds, prefill tokens per conversation)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(20, 1000, (rows, 24), generator=generator).tolist()
    params = SamplingParams(NEW_TOKENS, temperature=1.0, seed=seed)
    counter.tokens, started = 0, time.perf_counter()
    for _ in range(turns):
        if not reuse:
            engine.free_memory()
        completions = engine.generate(prompts, params)
        observations = torch.randint(20, 1000, (rows, OBSERVATION), generator=generator).tolist()
        prompts = [p + c.token_ids + o for p, c, o in zip(prompts, completions, observations)]
    return {"seconds": time.perf_counter() - started, "prefill_tokens": counter.tokens / rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    console = Console(width=120)
    model_dir = workload.build_model(Path("~/.cache/minirl/bench-qwen2-6m").expanduser())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    counter = PrefillCounter(model)
    engines = {"torch, KV reuse": ("torch", True), "torch, no reuse": ("torch", False), "hf generate": ("hf", False)}
    results: dict[str, list[dict]] = {name: [] for name in engines}
    for turns in range(1, args.max_turns + 1):
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for repeat in range(args.repeats):
            for name in engines if repeat % 2 == 0 else reversed(engines):
                engine_name, reuse = engines[name]
                engine = ENGINES.get(engine_name)(model, tokenizer, torch.device("cpu"))
                conversation_rollout(engine, counter, args.rows, 1, reuse, seed=turns)  # warm-up
                runs[name].append(conversation_rollout(engine, counter, args.rows, turns, reuse, seed=turns))
        for name, measured in runs.items():
            prefill = {run["prefill_tokens"] for run in measured}
            if len(prefill) > 1:
                raise RuntimeError(f"{name}, {turns} turns: the runs encoded different prefills {sorted(prefill)}")
            seconds, tokens = statistics.median(run["seconds"] for run in measured), prefill.pop()
            results[name].append({"turns": turns, "seconds": seconds, "prefill_tokens": tokens})
            console.print(f"{turns} turns, {name}: {seconds:.2f} s, {tokens:.0f} prefill tokens a row")
    args.out.mkdir(parents=True, exist_ok=True)
    setup = {"rows": args.rows, "new_tokens": NEW_TOKENS, "observation_tokens": OBSERVATION, "repeats": args.repeats}
    (args.out / "turns.json").write_text(json.dumps({**setup, "results": results}, indent=1) + "\n")
    plot(results, args.out / "turns.png")
    console.print(f"wrote {args.out / 'turns.json'} and {args.out / 'turns.png'}")


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tokens, seconds) = plt.subplots(1, 2, figsize=(10, 4))
    for name, runs in results.items():
        turns = [r["turns"] for r in runs]
        tokens.plot(turns, [r["prefill_tokens"] for r in runs], "o-", label=name)
        seconds.plot(turns, [r["seconds"] for r in runs], "o-", label=name)
    tokens.set(xlabel="turns", ylabel="prefill tokens per conversation", title="encoded tokens: linear with reuse")
    seconds.set(xlabel="turns", ylabel="rollout seconds", title="rollout time: the prefill's share grows without reuse")
    tokens.legend()
    seconds.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
