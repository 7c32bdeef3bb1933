"""Load a policy (and its tokenizer) by hub id or local path, through the Auto* classes. Loading never
builds or trains: `model.name_or_path=tiny` is resolved to a directory by `minirl.bootstrap` first, and
from there on the embedded model loads exactly like any other checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.config import Config
from minirl.errors import ConfigError
from minirl.protocol.chat import set_template_kwargs


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
    set_template_kwargs(tokenizer, cfg.model.chat_template_kwargs)  # every render passes them on
    return tokenizer
