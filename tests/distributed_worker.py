"""One rank of tests/test_distributed.py's gradient checks, launched by torchrun (gloo, CPU):

    torchrun --nproc_per_node 2 tests/distributed_worker.py STRATEGY OUT_DIR

For every loss.agg mode, the rank spreads a 2-layer Qwen2 over the ranks with STRATEGY (ddp | fsdp2), runs the
trainer's backward on one mini-batch of the whole batch (each rank its micro-batches) and, beside it, a single
process's backward on the same batch (a world of one, same weights); then one SGD step of each. Rank 0 writes
both gradients, both weights after the step and the metrics to OUT_DIR/<agg>.pt. Two broken variants show that
the comparison can fail: the gradients summed over the ranks instead of averaged, and not reduced at all (a
forward that skips the wrapper, whose hooks then never fire). Then the same under token-mean with gradient
checkpointing (OUT_DIR/checkpointed.pt) and with LoRA adapters (OUT_DIR/lora.pt).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen2Config, Qwen2ForCausalLM

from minirl.algos.losses import AGGREGATIONS
from minirl.config import LoraConfig, LossConfig, TrainerConfig
from minirl.distributed.strategies import STRATEGIES, Parallel
from minirl.distributed.world import World
from minirl.inference.sampling import SamplingParams
from minirl.models.loading import add_adapters, checkpoint_activations
from minirl.training.batch import PolicyBatch
from minirl.training.update import PolicyOptimizer

VOCAB = 61


def policy(variant: str = "plain") -> torch.nn.Module:
    """A 2-layer Qwen2 of fixed random weights; `variant` checkpointed: with gradient checkpointing (transformers'
    non-reentrant kind), lora: with rank-4 LoRA adapters on every linear layer (the rest frozen)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float()
    if variant == "checkpointed":
        checkpoint_activations(model)
    if variant == "lora":
        add_adapters(model, LoraConfig(r=4, alpha=8))
        with torch.no_grad():  # B = 0 at init would give A no gradient
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    return model


def batch() -> PolicyBatch:
    """Five groups of 2 rows with prompts of 3 to 7 tokens and responses of 1 to 9 (unequal lengths), tool
    observations masked out inside some responses, and one row without a single action token."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in (5, 3, 7, 4, 6)]
    rows = [
        (p, torch.randint(1, VOCAB, (int(torch.randint(1, 10, (), generator=g)),), generator=g))
        for p in prompts
        for _ in range(2)
    ]
    width = max(len(p) + len(r) for p, r in rows)
    start = min(len(p) for p, _ in rows) - 1
    n, targets = len(rows), width - 1 - start
    ids, attention = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, targets)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.cat([p, r])
        attention[i, : len(p) + len(r)] = 1
        first = len(p) - 1 - start
        mask[i, first : first + len(r)] = (torch.rand(len(r), generator=g) > 0.25).float()
    mask[3] = 0
    old = -torch.rand(n, targets, generator=g) * 3
    ref = -torch.rand(n, targets, generator=g) * 3
    advantages = torch.randn(n, generator=g)
    return PolicyBatch(
        ids, attention, start, old * mask, mask, advantages, torch.tensor([len(p) for p, _ in rows]), ref
    )


def full_grads(parallel: Parallel) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in parallel.trained.named_parameters():
        if p.grad is None:  # frozen
            continue
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name.removeprefix("module.")] = grad.detach().clone()
    return out


def full_weights(parallel: Parallel) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in parallel.trained.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        out[name.removeprefix("module.")] = value.detach().clone()
    return out


def learner(parallel: Parallel, agg: str) -> PolicyOptimizer:
    loss = LossConfig(name="grpo", agg=agg, beta=0.05, max_tokens_norm=8)
    trainer = TrainerConfig(micro_batch_size=2, lr=0.1)  # 5 micro-batches: 3 on rank 0, 2 (+ a weight-0 one) on 1
    out = PolicyOptimizer.adamw(
        parallel, loss, trainer, torch.device("cpu"), SamplingParams(max_new_tokens=8, temperature=1.0)
    )
    out.optimizer = torch.optim.SGD([p for p in parallel.trained.parameters() if p.requires_grad], lr=0.1)
    return out


def run(parallel: Parallel, agg: str, data: PolicyBatch) -> dict:
    """The backward of the whole batch as one mini-batch, then one SGD step: gradients, weights, metrics."""
    learn = learner(parallel, agg)
    parallel.trained.train()
    metrics = learn.backward(data, torch.arange(len(data.advantages)), poisoned=False)
    grads = full_grads(parallel)
    learn.optimizer.step()
    return {"grads": grads, "weights": full_weights(parallel), "metrics": metrics}


def compared(strategy: str, agg: str, data: PolicyBatch, world: World) -> dict:
    """One agg mode's results (rank 0's are saved). The wrapped models live only inside this call, so none outlives
    the process group: a DDP reducer freed after it blocks in gloo's destructor with the GIL held (World.close)."""
    single = run(Parallel(policy(), World()), agg, data)
    spread = run(STRATEGIES.get(strategy)(policy(), world), agg, data)
    summed = STRATEGIES.get(strategy)(policy(), world)
    if strategy == "ddp":  # all-reduce without the division by the world size
        summed.trained.register_comm_hook(None, lambda _, bucket: allreduce_sum(bucket))
    else:
        for unit in summed.trained.modules():  # every layer and the root
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    unreduced = STRATEGIES.get(strategy)(policy(), world)
    if strategy == "ddp":  # MiniMind's bug: the forward skips DDP, whose hooks then never fire
        unreduced.trained, unreduced.gradient_sync = unreduced.full, lambda enabled: contextlib.nullcontext()
    result = {
        "single": single, "spread": spread, "summed": run(summed, agg, data)["grads"],
        "unreduced": run(unreduced, agg, data)["grads"] if strategy == "ddp" else None,
    }  # fmt: skip
    result["unreduced"] = world.gather(result["unreduced"])
    return result


def main(strategy: str, out_dir: Path) -> None:
    world = World.from_env(torch.device("cpu"))
    data = batch()
    for agg in AGGREGATIONS.names():
        result = compared(strategy, agg, data, world)
        if world.is_main:
            torch.save(result, out_dir / f"{agg}.pt")
    for variant in ("checkpointed", "lora"):
        single = run(Parallel(policy(variant), World()), "token-mean", data)
        spread = run(STRATEGIES.get(strategy)(policy(variant), world), "token-mean", data)
        if world.is_main:
            torch.save({"single": single, "spread": spread}, out_dir / f"{variant}.pt")
    world.close()
    # no wrapper outlived the group: a reducer freed after it would block in gloo's destructor at this exit
    assert not [obj for obj in gc.get_objects() if isinstance(obj, DistributedDataParallel)]


def allreduce_sum(bucket) -> torch.futures.Future:
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
