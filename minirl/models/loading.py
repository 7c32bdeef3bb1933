"""Load a policy (and its tokenizer) or a reward model by hub id or local path, through the Auto* classes.
Loading never builds or trains: `model.name_or_path=tiny` is resolved to a directory by `minirl.bootstrap`
first, and from there on the embedded model loads exactly like any other checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from minirl.config import Config, LoraConfig, RewardModelConfig
from minirl.errors import ConfigError
from minirl.inference.adapters import ADAPTER, AdaptersOff
from minirl.protocol.chat import set_template_kwargs


def check_checkpoint(path: str, key: str = "model.name_or_path") -> None:
    """Raise ConfigError naming `key` when `path`, written as a local path, is no directory, or when a
    directory holds no saved model (a model's config.json, or the adapter_config.json of LoRA adapters, which
    load on the base model it names); a hub id is checked only when it loads."""
    local = Path(path).expanduser()
    if path.startswith(("/", "./", "../", "~")) and not local.is_dir():
        raise ConfigError(f"{key}: no checkpoint directory '{path}'")
    saved = any((local / name).is_file() for name in ("config.json", "adapter_config.json"))
    if local.is_dir() and not saved:
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


def add_adapters(model, lora: LoraConfig):
    """Inject LoRA adapters (peft) into `model` in place, its own weights frozen and only the adapters trained;
    the model stays the Hugging Face model it was (minirl/inference/adapters.py). A target module the model
    lacks, or peft not installed, is a ConfigError naming model.lora."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ImportError as err:
        raise ConfigError('model.lora.r > 0 needs peft: pip install -e ".[lora]"') from err
    config = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)
    )
    model.requires_grad_(False)
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise ConfigError(f"model.lora.target_modules: {str(err).splitlines()[0]}") from err
    return model


def checkpoint_activations(model, preserve_rng_state: bool = True) -> None:
    """transformers' gradient checkpointing, non-reentrant (the reentrant kind breaks DDP and LoRA's frozen input).
    `preserve_rng_state` (torch's): the global RNG is set back to the forward's state around each recomputation, so
    that dropout repeats, and restored after; False for a model without dropout whose RNG another thread draws
    from, as one step off's rollout does, which that restore would rewind."""
    kwargs = {"use_reentrant": False, "preserve_rng_state": preserve_rng_state}
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.24 on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _dropout(model) -> list[str]:
    """The model's dropout above 0: its config's `*dropout` / `*pdrop` fields and its nn.Dropout modules."""
    fields = [
        f"config.{key}={value}"
        for key, value in model.config.to_dict().items()
        if key.endswith(("dropout", "pdrop")) and type(value) in (int, float) and value > 0
    ]
    modules = [f"{name}.p={m.p}" for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    return fields + modules


def refuse_dropout_one_step_off(model, path: str) -> None:
    """One step off's rollout draws from the global torch RNG on its worker thread while the update runs: an update
    that drew too (dropout) would make a seeded run unrepeatable. ConfigError naming the dropout found."""
    found = _dropout(model)
    if found:
        listing = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ConfigError(
            f"trainer.async_rollout: the model at '{path}' has dropout ({listing}); the update would draw from the "
            "global torch RNG while the rollout samples from it, so a seeded run would not repeat: save a copy with "
            "dropout 0 in its config.json, or train without trainer.async_rollout"
        )


def load_policy(path: str, cfg: Config, device: torch.device):
    """The policy to train: the model at `path`, with gradient checkpointing when model.gradient_checkpointing, and
    with LoRA adapters when model.lora.r > 0 (their saved config names `path` as their base). One step off
    (trainer.async_rollout) refuses a model with dropout, and its checkpointing leaves the global RNG alone."""
    model = load_model(path, cfg, device)
    if cfg.trainer.async_rollout:
        refuse_dropout_one_step_off(model, path)
    if cfg.model.gradient_checkpointing:
        checkpoint_activations(model, preserve_rng_state=not cfg.trainer.async_rollout)
    if not cfg.model.lora.r:
        return model
    add_adapters(model, cfg.model.lora)
    local = Path(path).expanduser()
    model.peft_config[ADAPTER].base_model_name_or_path = str(local.resolve()) if local.is_dir() else path
    return model


def load_reference(path: str, cfg: Config, policy, device: torch.device):
    """The frozen reference: with LoRA the policy's own weights with its adapters off (no second copy in
    memory), else a second copy of the model at `path`, without gradients."""
    if cfg.model.lora.r:
        return AdaptersOff(policy)
    return load_model(path, cfg, device, trainable=False)


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
