"""LoRA adapters in a policy: found, turned off for the reference, and merged into plain weights for a sampler
or a checkpoint that loads no adapters.

The adapters are peft's, injected into the Hugging Face model in place (`peft.inject_adapter_in_model`, done by
minirl/models/loading.py), so the policy stays the model it was: every forward, the decoding core's fast path
and the torch and hf engines run base plus adapters without knowing of them. What needs to know:

    with adapters_off(policy): ...            # the reference: the same weights, adapters off (no second model)
    reference = AdaptersOff(policy)           # that as a module, for the code that calls a reference model
    weights = plain_state_dict(policy)        # {name: W + (alpha / r) B A} under the plain model's names (vLLM)
    save_adapters(policy, directory)          # peft's format: adapter_config.json, adapter_model.safetensors
    load_adapters(policy, directory)          # their weights back into the policy (a resumed run)

A directory save_adapters wrote loads with `AutoModelForCausalLM.from_pretrained(directory)` as base plus adapters
(transformers reads peft's format; the config names the base); one save_pretrained wrote with plain_state_dict
loads as a plain model anywhere, vLLM included.

A model without adapters passes through all three unchanged. peft is imported only for a model that has them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

ADAPTER = "default"  # the one adapter a policy has
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names
BASE = ".base_layer."  # what peft puts between a wrapped layer's name and its own parameters'


def adapter_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """name -> peft adapter layer of `model`; empty without adapters (peft then need not be installed)."""
    if "peft" not in sys.modules:  # nothing can have been injected without it
        return {}
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}


def has_adapters(model: torch.nn.Module) -> bool:
    return bool(adapter_layers(model))


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """`model` computes with its base weights alone inside; its adapters are back on after, however it ends."""
    layers = list(adapter_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class AdaptersOff(torch.nn.Module):
    """The policy with its adapters off, as a module of its own: the reference model of a LoRA run. It holds the
    policy's own parameters (no copy); its forward has the policy's signature."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.config = policy.config

        @functools.wraps(policy.forward)  # the signature the decoding core inspects (its cache argument)
        def forward(*args, **kwargs):
            with adapters_off(self.policy):
                return self.policy(*args, **kwargs)

        self.forward = forward


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s weights under the names of the model without adapters, each adapted layer's weight with its
    adapter's update added (W + (alpha / r) B A, peft's get_delta_weight); the model itself is left as it is.
    Without adapters: its state_dict."""
    layers = adapter_layers(model)
    if not layers:
        return model.state_dict()
    merged = {}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if ".lora_" in name:
                continue
            if BASE in name:
                layer, parameter = name.split(BASE, 1)
                if parameter == "weight":
                    tensor = tensor + layers[layer].get_delta_weight(ADAPTER).to(tensor.dtype)
                name = f"{layer}.{parameter}"
            merged[name] = tensor
    return merged


def save_adapters(model: torch.nn.Module, directory: Path) -> None:
    """The adapters' config (naming the base model it was given, models/loading.py) and weights, in peft's format."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(directory)
    weights = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    save_file({name: tensor.detach().contiguous() for name, tensor in weights.items()}, directory / ADAPTER_WEIGHTS)


def load_adapters(model: torch.nn.Module, directory: Path) -> None:
    """Set `model`'s adapter weights to those save_adapters wrote in `directory`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(directory / ADAPTER_WEIGHTS), adapter_name=ADAPTER)
