"""Peak memory and time of one policy update on a model shaped like Qwen2.5-0.5B, with and without each memory
option: gradient checkpointing (model.gradient_checkpointing), bf16 autocast (trainer.bf16_autocast), LoRA.

    python experiments/bench_memory.py [--rows 4] [--prompt 64] [--response 64] [--steps 2]

The model is a Qwen2ForCausalLM with Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 key-value heads,
MLP 4864, vocabulary 151,936, tied embeddings; 494M parameters) and random weights, in float32, built locally.
Each setting runs in a process of its own: it builds the model (and LoRA's adapters), then `--steps` optimizer
steps of the trainer's own update (PolicyOptimizer.step, GRPO's loss, the rows of one group sharing their prompt)
on `--rows` rows of `--prompt` + `--response` tokens, after one warm-up step. Reported: the resident memory before
the first step (the weights), the process's peak (ru_maxrss: the weights, gradients, AdamW's two moments and the
activations), and the median step time after the warm-up. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SETTINGS = {
    "full fine-tuning": [],
    "gradient checkpointing": ["model.gradient_checkpointing=true"],
    "bf16 autocast": ["trainer.bf16_autocast=true"],
    "checkpointing + bf16": ["model.gradient_checkpointing=true", "trainer.bf16_autocast=true"],
    "LoRA r=16": ["model.lora.r=16", "model.lora.alpha=32"],
    "LoRA r=16 + checkpointing": ["model.lora.r=16", "model.lora.alpha=32", "model.gradient_checkpointing=true"],
}
QWEN2_5_0_5B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
)  # fmt: skip


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def group_batch(rows: int, group_size: int, prompt: int, response: int, vocab: int):
    """A PolicyBatch of `rows` random rows of `prompt` + `response` tokens, each `group_size` of them sharing their
    prompt (a group), every response token an action, advantages spread over [-1, 1]."""
    import torch

    from minirl.training.batch import PolicyBatch

    g = torch.Generator().manual_seed(0)
    width, start = prompt + response, prompt - 1
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    for first in range(0, rows, group_size):
        ids[first : first + group_size, :prompt] = ids[first, :prompt]
    targets = width - 1 - start
    return PolicyBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), start=start, old_logp=torch.full((rows, targets), -10.0),
        mask=torch.ones(rows, targets), advantages=torch.linspace(-1, 1, rows),
        prompt_lengths=torch.full((rows,), prompt),
    )  # fmt: skip


def measure(overrides: list[str], rows: int, prompt: int, response: int, steps: int) -> dict:
    """One setting, in this process: what `main` prints per row."""
    import torch
    from hydra import compose, initialize_config_dir
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from minirl.config import register_configs, to_config
    from minirl.distributed.strategies import Parallel
    from minirl.distributed.world import World
    from minirl.entry import CONF_DIR
    from minirl.inference.sampling import SamplingParams
    from minirl.models.loading import add_adapters, checkpoint_activations
    from minirl.training.update import PolicyOptimizer

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=["loss.beta=0", *overrides]))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_5_0_5B))
    if cfg.model.gradient_checkpointing:
        checkpoint_activations(model)
    if cfg.model.lora.r:
        add_adapters(model, cfg.model.lora)
    cfg.trainer.micro_batch_size = rows
    device, sampling = torch.device("cpu"), SamplingParams.from_config(cfg.rollout, 1.0)
    learner = PolicyOptimizer.adamw(Parallel(model, World()), cfg.loss, cfg.trainer, device, sampling)
    batch = group_batch(rows, rows, prompt, response, QWEN2_5_0_5B["vocab_size"])
    before = rss_mb()
    model.train()
    times = []
    for _ in range(1 + steps):  # the first, a warm-up, also allocates AdamW's moments
        started = time.perf_counter()
        learner.step(batch, torch.arange(rows), poisoned=False)
        times.append(time.perf_counter() - started)
    times = times[1:]
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained": trained,
        "rss_before_mb": before,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_s": statistics.median(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one setting, in a child process
    args = parser.parse_args()
    if args.only:
        print(json.dumps(measure(SETTINGS[args.only], args.rows, args.prompt, args.response, args.steps)))
        return
    shape = f"{args.rows} rows x ({args.prompt} + {args.response}) tokens, {args.steps} steps"
    print(f"One update on a Qwen2.5-0.5B-shaped model (float32 weights), {shape}\n")
    print("| setting | trained parameters | memory before the first step | peak memory | step time |")
    print("| --- | --- | --- | --- | --- |")
    for name in SETTINGS:
        command = [sys.executable, __file__, "--only", name, *sys.argv[1:]]
        out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        print(
            f"| {name} | {out['trained'] / 1e6:.1f}M of {out['parameters'] / 1e6:.0f}M | "
            f"{out['rss_before_mb'] / 1024:.2f} GiB | {out['peak_mb'] / 1024:.2f} GiB | {out['step_s']:.1f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
