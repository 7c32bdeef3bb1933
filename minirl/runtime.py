"""Where and how a process computes: seeding every RNG, picking the device and its attention kernels."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from minirl.errors import ConfigError


def seed_everything(seed: int, deterministic: bool, threads: int = 0) -> None:
    """Seed every RNG; `deterministic` also picks kernels whose float sums run in a fixed order, so that a
    seed gives the same run each time (on CPU, accumulating index writes otherwise add in thread order).
    `threads` > 0 sets torch's thread count, which float sums depend on too (0 leaves torch's own)."""
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for fixed-order sums
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of the RNG streams of rank `rank` > 0 under several processes (rank 0 keeps `seed`'s own):
    derived from (seed, rank), so that no two ranks, nor two seeds, share a stream."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def resolve_device(name: str, deterministic: bool = False, key: str = "trainer.device") -> torch.device:
    """`name` (auto: CUDA when there is one) as a torch device; on CUDA, picks the attention kernels.
    `deterministic`: backward passes must add up in a fixed order (training under trainer.deterministic).
    A device this machine lacks is a ConfigError naming `key`."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if device.type in available and not available[device.type]():
        raise ConfigError(f"{key}={name}: no {device.type} device here (torch {torch.__version__}); use auto or cpu")
    if device.type == "cuda":
        choose_cuda_attention(deterministic)
    return device


def bf16_emulated(device: torch.device) -> bool:
    """Whether bfloat16 math on `device` is emulated: a CPU oneDNN has no bf16 kernels for (one with AVX2 and no
    AVX-512, say), where `make bench`'s update took 26x as long under bf16 autocast as in float32."""
    return device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()


def choose_cuda_attention(deterministic: bool) -> None:
    """cuDNN's fused attention builds a graph for each new sequence length (hundreds of ms each), and
    rollouts and updates bring new lengths every step, so it is off. The other fused kernels' backward
    passes add up in whatever order their blocks finish: a deterministic run attends with the math kernel.
    (CUDA only: the CPU kernels read the same switches.)"""
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(not deterministic)
    torch.backends.cuda.enable_mem_efficient_sdp(not deterministic)
