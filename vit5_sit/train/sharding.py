"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``) for the training loop.

Each transformer block, then the whole model, is sharded over all processes: every process keeps 1/W of
the parameters, gradients and AdamW state, and all-gathers a block's weights just before using them. The
EMA copy is sharded the same way and updated shard by shard, without communication.

Checkpoints stay in the one format every run writes (full tensors, the plain ``optimizer.state_dict()``
layout): :func:`full_state` gathers a sharded state dict into full tensors (a collective: every process
calls it, in the same order), and :func:`shard_optimizer_state` cuts a full optimizer state into this
process's shards. So a run can move between one process, DDP and FSDP at any checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _dtensor_type():
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors)."""
    DTensor = _dtensor_type()
    return any(isinstance(p, DTensor) for p in model.parameters())


def shard_model(model: nn.Module, device_type: str) -> nn.Module:
    """Shard each block of ``model.blocks``, then the rest, over all processes of the default group (in place).

    Parameters stay fp32 (mixed precision comes from autocast, as without sharding).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """The process's own part of ``t``: its shard for a DTensor (same storage), ``t`` otherwise."""
    return t.to_local() if isinstance(t, _dtensor_type()) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` on every process (all-gathers a DTensor; a collective)."""
    return t.full_tensor() if isinstance(t, _dtensor_type()) else t


def full_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (nested dicts / lists of tensors) with every DTensor gathered to a full CPU tensor; other
    values are returned as they are (no copy: the checkpoint writer copies them to the CPU once)."""
    if isinstance(state, dict):
        return {k: full_state(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(full_state(v) for v in state)
    if isinstance(state, _dtensor_type()):
        return state.full_tensor().detach().cpu()
    return state


def shard_optimizer_state(full: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A full ``optimizer.state_dict()`` with each per-parameter tensor cut into this process's shard.

    Tensors shaped like their parameter are distributed like it (each process slices its own part; no
    communication); scalars (AdamW's ``step``) are kept whole.
    """
    from torch.distributed.tensor import distribute_tensor

    DTensor = _dtensor_type()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, per_param in full["state"].items():
        p = params[int(index)]
        state[index] = {
            k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape else v
            for k, v in per_param.items()
        }
    return {"state": state, "param_groups": full["param_groups"]}
