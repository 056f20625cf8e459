"""A run's processes under `torchrun` (without it, rank 0 of 1) and the collectives it uses,
each a no-op or the local answer in a single process."""

from __future__ import annotations

import os

import torch
from torch import nn


class Ranks:
    """This process's rank among the run's `world` processes, from torchrun's environment."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = self.world > 1
        self.rank = int(os.environ.get("RANK", "0"))
        self.is_main = self.rank == 0
        # Under torchrun each process of a machine takes its own GPU: gpu_id + its local rank.
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.distributed else 0
        self.device = torch.device("cpu")

    def start(self, device: torch.device) -> None:
        """Join the process group (once), reducing on `device` (NCCL: CUDA tensors only)."""
        self.device = device
        if self.distributed and not torch.distributed.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def max(self, value: float) -> float:
        """The largest `value` of all ranks (the same answer on all, so that all stop)."""
        if not self.distributed:
            return value
        reduced = torch.tensor([float(value)], device=self.device)
        torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MAX)
        return reduced.item()

    def checksums(self, model: nn.Module) -> list[float]:
        """Every rank's sum of all weights of `model` (float64), gathered on all ranks."""
        local = torch.tensor(
            [sum(p.detach().double().sum().item() for p in model.parameters())],
            dtype=torch.float64,
            device=self.device,
        )
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        torch.distributed.all_gather(gathered, local)
        return [g.item() for g in gathered]  # .item() moves each to the host
