"""Step time and peak memory of one policy update on one process against two (torchrun, gloo on CPU; NCCL with
--device cuda), for the same global batch, under each strategy (trainer.strategy).

    python experiments/bench_distributed.py [--layers 8] [--rows 8] [--group 2] [--prompt 64] [--response 64]
        [--micro 4] [--steps 2] [--threads 2] [--device cpu]

The model is Qwen2.5-0.5B's shape (bench_memory.py) cut to `--layers` decoder layers, random float32 weights.
One process runs with `--threads` torch threads; each of two runs with half as many, so both use the same cores.
Each setting does `--steps` optimizer steps of the trainer's own update (PolicyOptimizer.step, GRPO's loss) on
the same `--rows` rows (groups of `--group` sharing a prompt) in micro-batches of `--micro`, after a warm-up
step. Reported per setting: the median step time, and per rank the peak memory (ru_maxrss on CPU, the CUDA
allocator's peak on CUDA) and the bytes of the trained state it holds (weights, gradients, AdamW's moments).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench_memory import QWEN2_5_0_5B, group_batch

SETTINGS = {"1 process": (1, "none"), "2 processes, ddp": (2, "ddp"), "2 processes, fsdp2": (2, "fsdp2")}


def local_bytes(tensor) -> int:
    """Bytes of `tensor` on this rank (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def measure(strategy: str, args: argparse.Namespace) -> dict | None:
    """One setting on this rank; rank 0 returns what `main` prints (the others None)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from minirl.config import LossConfig, TrainerConfig
    from minirl.distributed.strategies import STRATEGIES
    from minirl.distributed.world import World
    from minirl.inference.sampling import SamplingParams
    from minirl.training.update import PolicyOptimizer

    world = World.from_env(torch.device(args.device))
    torch.set_num_threads(max(1, args.threads // world.size))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{**QWEN2_5_0_5B, "num_hidden_layers": args.layers})).to(world.device)
    parallel = STRATEGIES.get(strategy)(model, world)
    trainer = TrainerConfig(micro_batch_size=args.micro, lr=1e-5)
    sampling = SamplingParams(max_new_tokens=args.response, temperature=1.0)
    learner = PolicyOptimizer.adamw(parallel, LossConfig(beta=0.0), trainer, world.device, sampling)
    batch = group_batch(args.rows, args.group, args.prompt, args.response, QWEN2_5_0_5B["vocab_size"])
    parallel.trained.train()
    times = []
    for _ in range(1 + args.steps):  # the first, a warm-up, also allocates AdamW's moments
        world.barrier()
        started = time.perf_counter()
        learner.step(batch, torch.arange(args.rows), poisoned=False)
        world.barrier()
        times.append(time.perf_counter() - started)
    state = sum(local_bytes(p) * 2 for p in parallel.trained.parameters())  # each weight and its gradient's room
    state += sum(local_bytes(t) for s in learner.optimizer.state.values() for t in s.values() if t.dim())
    if world.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(world.device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ranks = world.gather({"peak_mb": peak, "state_mb": state / 2**20})
    world.close()
    if not world.is_main:
        return None
    parameters = sum(p.numel() for p in parallel.full.parameters())
    return {"parameters": parameters, "step_s": statistics.median(times[1:]), "ranks": ranks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--layers", 8), ("--rows", 8), ("--group", 2), ("--prompt", 64), ("--response", 64),
                          ("--micro", 4), ("--steps", 2), ("--threads", 2)):  # fmt: skip
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one setting, in this (child) process
    args, _ = parser.parse_known_args()
    if args.only:
        out = measure(SETTINGS[args.only][1], args)
        if out is not None:
            print(json.dumps(out))
        return
    shape = f"{args.layers} layers, {args.rows} rows x ({args.prompt} + {args.response}) tokens"
    print(f"One update of a Qwen2.5-0.5B-shaped model cut to {shape}, micro-batches of {args.micro}\n")
    print("| setting | step time | peak memory per rank | trained state per rank |")
    print("| --- | --- | --- | --- |")
    for name, (processes, _) in SETTINGS.items():
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        command = [*(launcher if processes > 1 else [sys.executable]), __file__, *sys.argv[1:], "--only", name]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads // processes))}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1]} | | |", flush=True)
            continue
        out = json.loads(done.stdout.strip().splitlines()[-1])
        peaks = ", ".join(f"{r['peak_mb'] / 1024:.2f}" for r in out["ranks"])
        states = ", ".join(f"{r['state_mb'] / 1024:.2f}" for r in out["ranks"])
        print(f"| {name} | {out['step_s']:.2f} s | {peaks} GiB | {states} GiB |", flush=True)


if __name__ == "__main__":
    main()
