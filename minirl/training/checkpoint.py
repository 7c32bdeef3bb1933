"""Atomic training checkpoints, the newest `trainer.keep_last` kept, and resuming from the newest one.

    <run dir>/checkpoints/step_000040/
        config.json, model.safetensors, tokenizer files   the policy: loads by path like any checkpoint
        (with LoRA: adapter_config.json, adapter_model.safetensors: the adapters alone, in peft's format; they
        load by path too, on the base model their config names)
        trainer_state.pt                                  optimizer, LR schedule, RNG states, data position, ...

The final policy (`save_policy(..., merged=True)`) of a LoRA run is a plain model with the adapters merged into
its weights, for minirl.eval, minirl.serve and vLLM, with the adapters themselves in its `adapter/`.

A checkpoint is written into a temporary sibling directory and renamed into place once every file is on
disk, so a crash at any moment leaves the earlier checkpoints and either all of the new one or none of it.
Directories that do not match `step_<digits>` (such as an interrupted write) are never resumed from.

    path = save_checkpoint(run_dir, step, policy, tokenizer, state, keep_last=2)
    latest = latest_checkpoint(run_dir)        # None when there is none
    state = load_trainer_state(latest)
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minirl.config import Config
from minirl.errors import ConfigError
from minirl.inference.adapters import has_adapters, load_adapters, plain_state_dict, save_adapters
from minirl.models.loading import load_model

CHECKPOINTS = "checkpoints"
ADAPTER_DIR = "adapter"  # a final LoRA policy's adapters, beside its merged weights
TRAINER_STATE = "trainer_state.pt"
_NAME = re.compile(r"step_(\d+)")


def rng_state() -> dict[str, Any]:
    """The global RNG states that sampling and shuffling draw from: Python, NumPy, torch (and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_rng_state(states: list[dict[str, Any]] | dict[str, Any], rank: int, ranks: int) -> dict[str, Any]:
    """Rank `rank`'s RNG states among a checkpoint's (one per rank that wrote it; a single dict in checkpoints
    of earlier versions). A run resumes with as many processes as wrote the checkpoint, else ConfigError."""
    states = [states] if isinstance(states, dict) else states
    if len(states) != ranks:
        raise ConfigError(
            f"trainer.resume=auto: the checkpoint was written by {len(states)} processes, this run has {ranks}; "
            "resume with as many (torchrun --nproc_per_node), or start a new run directory"
        )
    return states[rank]


def _fsync_tree(root: Path) -> None:
    """Flush every file under `root` to disk, so the rename publishes complete files."""
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    done = [p for p in folder.iterdir() if p.is_dir() and _NAME.fullmatch(p.name) and (p / TRAINER_STATE).exists()]
    return sorted(done, key=lambda p: int(_NAME.fullmatch(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def save_policy(policy, tokenizer, directory: Path, merged: bool = False) -> None:
    """The policy and its tokenizer in `directory` as save_pretrained writes them. With LoRA adapters: the
    adapters alone, or with `merged` a plain model of the merged weights and the adapters in directory/adapter."""
    if not has_adapters(policy):
        policy.save_pretrained(directory)
    elif merged:
        policy.save_pretrained(directory, state_dict=plain_state_dict(policy))
        save_adapters(policy, directory / ADAPTER_DIR)
    else:
        save_adapters(policy, directory)
    tokenizer.save_pretrained(directory)


def restore_policy(policy, checkpoint: Path, cfg: Config, device: torch.device) -> None:
    """Set the policy's trained weights (its adapters' alone, with LoRA) to those saved in `checkpoint`."""
    if has_adapters(policy):
        load_adapters(policy, checkpoint)
    else:
        policy.load_state_dict(load_model(str(checkpoint), cfg, device).state_dict())


def save_checkpoint(run_dir: Path, step: int, policy, tokenizer, state: dict[str, Any], keep_last: int) -> Path:
    """Write the policy, its tokenizer and `state` as checkpoint `step`, atomically; then delete all but
    the newest `keep_last` checkpoints. Returns the checkpoint's directory."""
    folder = run_dir / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"step_{step:06d}"
    tmp = folder / f".tmp-step_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy, tokenizer, tmp)
    torch.save(state, tmp / TRAINER_STATE)
    _fsync_tree(tmp)
    if target.exists():  # the same step saved again (a resumed run redoing it): replace it whole
        shutil.rmtree(target)
    os.replace(tmp, target)
    for old in checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The `state` dict saved with the checkpoint (trusted: written by this run directory's trainer)."""
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False)
