"""Load a policy (and its tokenizer) by hub id or local path, through the Auto* classes.

`model.name_or_path=tiny` resolves to the embedded model's cache directory first (building and
warm-starting it when missing); from there on it is loaded exactly like any other checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.config import Config
from minirl.registry import ConfigError


def resolve_device(name: str, deterministic: bool = False) -> torch.device:
    """`name` (auto: CUDA when there is one) as a torch device; on CUDA, picks the attention kernels.
    `deterministic`: backward passes must add up in a fixed order (training under trainer.deterministic)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if device.type in available and not available[device.type]():
        raise ConfigError(
            f"trainer.device={name}: no {device.type} device here (torch {torch.__version__}); use auto or cpu"
        )
    if device.type == "cuda":
        choose_cuda_attention(deterministic)
    return device


def choose_cuda_attention(deterministic: bool) -> None:
    """cuDNN's fused attention builds a graph for each new sequence length (hundreds of ms each), and
    rollouts and updates bring new lengths every step, so it is off. The other fused kernels' backward
    passes add up in whatever order their blocks finish: a deterministic run attends with the math kernel.
    (CUDA only: the CPU kernels read the same switches.)"""
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(not deterministic)
    torch.backends.cuda.enable_mem_efficient_sdp(not deterministic)


def resolve_model_path(cfg: Config, console, warm_start: bool = True) -> str:
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    from minirl.models.bootstrap import ensure_tiny

    return str(ensure_tiny(cfg, console, warm=cfg.model.warm_start and warm_start))


def _from_pretrained(auto_class, path: str, **kwargs):
    """`auto_class.from_pretrained(path)`; a checkpoint that is neither a local directory nor on the hub (or
    the hub is out of reach), or a directory with no saved model, is a ConfigError naming model.name_or_path,
    with the first line of the reason."""
    local = Path(path).expanduser()
    if path.startswith(("/", "./", "../", "~")) and not local.is_dir():
        raise ConfigError(f"model.name_or_path: no checkpoint directory '{path}'")
    if local.is_dir() and not (local / "config.json").is_file():
        raise ConfigError(f"model.name_or_path: '{path}' holds no saved model (no config.json from save_pretrained)")
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as err:
        lines = str(err).strip().splitlines()
        reason = lines[0] if lines else type(err).__name__
        raise ConfigError(
            f"model.name_or_path: cannot load '{path}' (a hub id or a checkpoint directory): {reason}"
        ) from err


def load_model(path: str, cfg: Config, device: torch.device, trainable: bool = True):
    dtype = getattr(torch, cfg.model.dtype.value)
    model = _from_pretrained(AutoModelForCausalLM, path, dtype=dtype, trust_remote_code=cfg.model.trust_remote_code)
    model = model.to(device)
    model.requires_grad_(trainable)
    return model.train(trainable)


def load_tokenizer(path: str, cfg: Config):
    tokenizer = _from_pretrained(AutoTokenizer, path, trust_remote_code=cfg.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(cfg: Config, console, device: torch.device, warm_start: bool = True):
    path = resolve_model_path(cfg, console, warm_start)
    return load_model(path, cfg, device), load_tokenizer(path, cfg)
