"""How the policy is spread over the ranks (`trainer.strategy`), behind one interface, `Parallel`:

    none    one process: the model itself
    ddp     torch's DistributedDataParallel: a replica per rank, gradients averaged by its backward hooks
    fsdp2   torch's fully_shard (FSDP2, experimental): each decoder layer, then the model, sharded over the
            ranks; gradients reduce-scattered (averaged), optimizer state sharded

`trained` is the module the update's forwards and backwards go through: the wrapper, whose forward is what
arms the gradient averaging (a forward that skips it leaves every rank with its own gradient). `full` is a
plain module with the same weights for every forward without gradients: the rollout engine, evaluation,
pi_old, the LoRA reference, saving. Under ddp it is the wrapped module; under fsdp2 a copy taken before
sharding that `gathered()` refreshes after each update, since a sharded module's every forward is a
collective and ranks decoding rows of different lengths would make different numbers of them (a deadlock).
Under fsdp2 each rank thus holds the full weights once besides its shard of the trained state.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from minirl.distributed.world import World
from minirl.errors import ConfigError
from minirl.registry import Registry

STRATEGIES: Registry[type] = Registry("trainer.strategy")


@STRATEGIES.register("none")
class Parallel:
    """One process: `trained` and `full` are the model itself. The base of every strategy."""

    # the update's forwards may encode a group's prompt once (prompt_shared_logits): one forward or two,
    # by what the micro-batch holds
    shares_prompts = True

    def __init__(self, model: torch.nn.Module, world: World) -> None:
        if world.size > 1 and type(self) is Parallel:
            raise ConfigError(
                f"trainer.strategy=none under {world.size} processes: every rank would train alone; "
                "use trainer.strategy=ddp or fsdp2"
            )
        self.trained, self.full, self.world = model, model, world

    def gradient_sync(self, enabled: bool):
        """A context for one micro-batch's forward and backward: gradients are reduced over the ranks only with
        `enabled` (the mini-batch's last micro-batch; the others accumulate locally)."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """[] the global gradient norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self.trained.parameters(), max_norm)

    def gathered(self) -> None:
        """Bring `full` up to date with the trained weights (after the optimizer steps of a train step)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's whole state, for the checkpoint rank 0 writes (every rank calls it)."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def loaded(self) -> None:
        """`full` was restored from a checkpoint: set the trained weights to it."""


@STRATEGIES.register("ddp")
class DataParallel(Parallel):
    def __init__(self, model: torch.nn.Module, world: World) -> None:
        super().__init__(model, world)
        ids = [world.device.index] if world.device.type == "cuda" else None
        # buffers (rotary tables) are built alike on every rank: no broadcast before every forward
        self.trained = DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)

    def gradient_sync(self, enabled: bool):
        return contextlib.nullcontext() if enabled else self.trained.no_sync()


@STRATEGIES.register("fsdp2")
class FullyShardedDataParallel(Parallel):
    shares_prompts = False  # one forward per micro-batch on every rank: each forward is a collective

    def __init__(self, model: torch.nn.Module, world: World) -> None:
        super().__init__(model, world)
        self.full = copy.deepcopy(model).requires_grad_(False)
        for layer in decoder_layers(model):
            fully_shard(layer)
        self.trained = fully_shard(model)
        self._full_params = dict(self.full.named_parameters())
        self._trained_names = [name for name, p in self.trained.named_parameters() if p.requires_grad]

    def gradient_sync(self, enabled: bool):
        self.trained.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        norm = super().clip_grad_norm_(max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    @torch.no_grad()
    def gathered(self) -> None:
        params = dict(self.trained.named_parameters())
        for name in self._trained_names:  # the same order on every rank: each full_tensor() is a collective
            self._full_params[name].copy_(params[name].full_tensor())

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.trained, optimizer, options=options)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        set_optimizer_state_dict(self.trained, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def loaded(self) -> None:
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.trained, self.full.state_dict(), options=options)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, each an FSDP2 unit: the classes transformers names in `_no_split_modules`,
    else the entries of its ModuleLists."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        layers = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
    return layers
