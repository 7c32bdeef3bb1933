"""The process group of a run launched by `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK in the environment), and the
collectives the trainer needs. A single process is a world of one: no process group, every collective the
identity. The backend follows the device: NCCL on CUDA, gloo on CPU.

    world = World.from_env(device)     # device: the trainer's; on CUDA each rank takes cuda:LOCAL_RANK
    rounds = world.gather(my_trajs)    # [rank 0's, rank 1's, ...] on every rank
    world.sum_(logp)                   # in place: the sum over ranks
    rollouts = world.own_group()       # the same ranks in a group of their own, for collectives on another thread
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")  # where this rank computes; collectives' tensors travel there
    group: Any = None  # the process group the collectives run in; None: the default one (from_env's)

    @classmethod
    def from_env(cls, device: torch.device) -> World:
        """The world torchrun started this process in (a world of one without it); joins its process group.
        On CUDA with several ranks, this rank's device is cuda:LOCAL_RANK."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size == 1:
            return cls(device=device)
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        return cls(rank, size, local_rank, device)

    def own_group(self) -> World:
        """The same ranks in a gloo process group of their own, its collectives' tensors on the CPU: a thread may
        run them while another runs the default group's (one step off's rollout, gathering its groups, during
        the update, whose DDP or FSDP2 backward reduces gradients). A group serves one thread, and its collectives
        run in the same order on every rank. Every rank calls this, in the same order."""
        if self.size == 1:
            return self
        return dataclasses.replace(self, device=torch.device("cpu"), group=dist.new_group(backend="gloo"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    def share(self, items: list[T]) -> list[T]:
        """This rank's contiguous part of `items`, near-equal parts in rank order (rank 0's first)."""
        bounds = [len(items) * r // self.size for r in range(self.size + 1)]
        return items[bounds[self.rank] : bounds[self.rank + 1]]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj` (picklable), in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over ranks, in place (it travels to this rank's device and back); returns it."""
        if self.size > 1:
            moved = tensor.to(self.device)
            dist.all_reduce(moved, op=dist.ReduceOp.SUM, group=self.group)
            tensor.copy_(moved)
        return tensor

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)

    def close(self, failed: BaseException | None = None) -> None:
        """Leave the process group once the run is over; after this rank `failed`, at once (the others may be
        waiting in a collective) and saying on stderr which rank failed and why. Release the wrapped models
        (DistributedDataParallel) before: one that outlives the group can hang this process at its exit."""
        if self.size == 1 or not dist.is_initialized():
            return
        # Wrapped models go now, while the group lives: a DDP reducer (it holds the group) freed after
        # destroy_process_group runs gloo's destructor, which joins its worker threads with the GIL held while a
        # worker may need the GIL to free a finished work's tensors (a hang, or SIGABRT at exit). Those left are
        # in reference cycles, or in the frames of the failed call (its locals; the traceback keeps its lines).
        if failed is not None:
            traceback.clear_frames(failed.__traceback__)
        gc.collect()
        if failed is None:
            dist.barrier()  # no rank leaves while another still has work in flight
        else:
            print(f"minirl: rank {self.rank} of {self.size} failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        dist.destroy_process_group()
