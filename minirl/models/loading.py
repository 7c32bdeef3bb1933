"""Load a policy (and its tokenizer) or a reward model by hub id or local path, through the Auto* classes.
Loading never builds or trains: `model.name_or_path=tiny` is resolved to a directory by `minirl.bootstrap`
first, and from there on the embedded model loads exactly like any other checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from minirl.config import Config, RewardModelConfig
from minirl.errors import ConfigError
from minirl.protocol.chat import set_template_kwargs


def check_checkpoint(path: str, key: str = "model.name_or_path") -> None:
    """Raise ConfigError naming `key` when `path`, written as a local path, is no directory, or when a
    directory holds no saved model; a hub id is checked only when it loads."""
    local = Path(path).expanduser()
    if path.startswith(("/", "./", "../", "~")) and not local.is_dir():
        raise ConfigError(f"{key}: no checkpoint directory '{path}'")
    if local.is_dir() and not (local / "config.json").is_file():
        raise ConfigError(f"{key}: '{path}' holds no saved model (no config.json from save_pretrained)")


def _from_pretrained(auto_class, path: str, key: str = "model.name_or_path", **kwargs):
    """`auto_class.from_pretrained(path)`; a checkpoint that is neither a local directory nor on the hub (or
    the hub is out of reach), or a directory with no saved model, is a ConfigError naming `key`, with the first
    line of the reason."""
    check_checkpoint(path, key)
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as err:
        lines = str(err).strip().splitlines()
        reason = lines[0] if lines else type(err).__name__
        raise ConfigError(f"{key}: cannot load '{path}' (a hub id or a checkpoint directory): {reason}") from err


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


def load_reward_model(cfg: RewardModelConfig, device: torch.device):
    """(model, tokenizer) of the reward model at cfg.name_or_path: an AutoModelForSequenceClassification with one
    output, in eval mode without gradients. A checkpoint with another number of outputs, or none trained (a
    causal LM loads with a random head), is a ConfigError naming reward.model.name_or_path."""
    key, path = "reward.model.name_or_path", cfg.name_or_path
    dtype = getattr(torch, cfg.dtype.value)
    model, info = _from_pretrained(AutoModelForSequenceClassification, path, key, dtype=dtype, output_loading_info=True)
    labels = model.config.num_labels
    if labels != 1:
        raise ConfigError(f"{key}: '{path}' has {labels} outputs; a reward model has one (num_labels=1)")
    if info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"]))
        raise ConfigError(f"{key}: '{path}' is no trained reward model: its checkpoint lacks {missing}")
    tokenizer = _from_pretrained(AutoTokenizer, path, key)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:  # the model scores each row at its last token that is not padding
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).requires_grad_(False).eval(), tokenizer
