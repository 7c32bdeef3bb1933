"""Memory options of the update with the real trainer on the debug preset: gradient checkpointing
(model.gradient_checkpointing) gives the update the same gradients, the shared-prompt forward included (which
under checkpointing falls back to encoding every row: transformers' checkpointed layers drop a KV cache), with
full weights and with LoRA; bf16 autocast (trainer.bf16_autocast) keeps the weights in their dtype, and a run
asking for bf16 on a CPU that emulates it says so at start-up."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console
from support import debug_config

from minirl.bootstrap import model_path
from minirl.inference.decoding import drops_cache, prompt_shared_logits
from minirl.runtime import bf16_emulated
from minirl.trainer import Trainer

# two steps, prompts shared by their groups' rows (group_size 2), a micro-batch of 2: the shared-prompt forward runs
STEPS = ("trainer.steps=1", "rollout.group_size=4", "trainer.micro_batch_size=4")


def one_step(cache_dir, run_dir, *overrides: str) -> tuple[Trainer, dict[str, float]]:
    cfg = debug_config(cache_dir, run_dir, *STEPS, *overrides)
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)), Console(quiet=True))
    trainer.step = 1
    metrics, _ = trainer.train_step()
    return trainer, metrics


@pytest.mark.parametrize("lora", [(), ("model.lora.r=4",)], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_update_the_same_gradients(cache_dir, tmp_path, lora):
    plain, plain_metrics = one_step(cache_dir, tmp_path / "plain", *lora)
    checkpointed, metrics = one_step(cache_dir, tmp_path / "ckpt", "model.gradient_checkpointing=true", *lora)
    checkpointed.policy.train(), plain.policy.train()
    assert drops_cache(checkpointed.policy) and not drops_cache(plain.policy)  # checkpointing on, and only there
    assert metrics["grad_norm"] > 0
    assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-5)
    assert metrics["loss/policy"] == pytest.approx(plain_metrics["loss/policy"], rel=1e-4, abs=1e-7)
    for (name, a), (_, b) in zip(plain.policy.named_parameters(), checkpointed.policy.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name  # the same optimizer step


def test_the_shared_prompt_forward_under_checkpointing_encodes_every_row_and_agrees(cache_dir, tmp_path):
    trainer, _ = one_step(cache_dir, tmp_path, "model.gradient_checkpointing=true", "trainer.steps=1")
    policy = trainer.policy
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 9, 10, 11]])  # one shared prefix of 3 tokens
    mask, prefix = torch.ones_like(ids), torch.tensor([3, 3])
    policy.train()
    assert drops_cache(policy)
    trained = prompt_shared_logits(policy, ids, mask, prefix, 4)
    policy.eval()
    assert not drops_cache(policy)  # in eval mode the cache is used again, and the prefix encoded once
    with torch.no_grad():
        shared = prompt_shared_logits(policy, ids, mask, prefix, 4)
    assert torch.allclose(trained.detach()[:, 1:], shared[:, 1:], atol=1e-5)


def test_bf16_autocast_updates_float32_weights(cache_dir, tmp_path):
    trainer, metrics = one_step(cache_dir, tmp_path, "trainer.bf16_autocast=true")
    assert metrics["grad_norm"] > 0 and metrics["faults/skipped_updates"] == 0
    assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}


@pytest.mark.parametrize("bf16", [(), ("trainer.bf16_autocast=true",), ("model.dtype=bfloat16",)],
                         ids=["float32", "autocast", "bf16-weights"])  # fmt: skip
def test_bf16_on_a_cpu_without_bf16_kernels_is_warned_of_at_start_up(cache_dir, tmp_path, bf16):
    cfg = debug_config(cache_dir, tmp_path, "trainer.device=cpu", *bf16)
    console = Console(record=True, width=400)
    Trainer(cfg, model_path(cfg, Console(quiet=True)), console)
    warned = "on a CPU without bf16 kernels" in console.export_text()
    assert warned == (bool(bf16) and bf16_emulated(torch.device("cpu")))  # this machine's kernels decide
