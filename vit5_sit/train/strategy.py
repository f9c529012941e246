"""How training is laid out over processes: one small interface, two implementations.

- :class:`Replicated`: one process, or DDP over many (accelerate wraps the trainee and the optimizer).
- :class:`Sharded`: FSDP2 (``torch.distributed.fsdp.fully_shard``): each transformer block, then the rest of
  the trainee, is sharded over all processes, so each keeps 1/W of the parameters, gradients and AdamW
  state; the EMA copy is sharded the same way and averaged shard by shard, without communication.

Both give the loop the same calls: :meth:`prepare`, :meth:`autocast`, :meth:`before_micro_step`,
:meth:`clip`, :meth:`gather` (a checkpoint's full tensors on the main process), :meth:`load` and
:meth:`sampling_model`. Checkpoints have one format whatever the strategy (full tensors; the plain
``optimizer.state_dict()`` layout, parameters numbered in the trainee's order), so a run moves between one
process, DDP and FSDP at any checkpoint. The sharded strategy gathers and loads through
``torch.distributed.checkpoint.state_dict`` (``full_state_dict``, ``cpu_offload``) and only converts its
parameter-name keys of the optimizer state to and from those numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vit5_sit.train.ema import EMA


class StrategyError(RuntimeError):
    """A launch the strategies cannot run; the message says what to change."""


@dataclass
class FullState:
    """A checkpoint's tensors: full, on the CPU (the main process's view)."""

    model: dict[str, torch.Tensor]
    projector: dict[str, torch.Tensor] | None
    ema: dict[str, torch.Tensor]
    optimizer: dict


def use_fsdp(cfg, accelerator, world: int, log: Callable[[str], None]) -> bool:
    """Whether to shard with FSDP2: ``train.fsdp`` or an accelerate config with ``distributed_type: FSDP``."""
    launched = accelerator.distributed_type.value
    if launched in ("DEEPSPEED", "MEGATRON_LM"):
        raise StrategyError(
            f"{launched} is not supported: launch with data parallelism (accelerate launch --multi_gpu ...) or "
            "with FSDP (train.fsdp=true, or an accelerate config with distributed_type: FSDP)")
    if not (cfg.train.fsdp or launched == "FSDP"):
        return False
    if world == 1:
        log("FSDP asked for with one process: nothing to shard, training unsharded")
        return False
    if cfg.train.mixed_precision == "fp16":
        raise StrategyError("train.mixed_precision=fp16 is not supported with FSDP (its loss scaler needs sharded "
                            "gradients); use train.mixed_precision=bf16")
    log(f"FSDP2: each transformer block, the model and the EMA sharded over {world} processes"
        + (" (accelerate's fsdp_* options other than FSDP itself are not read)" if launched == "FSDP" else ""))
    return True


def make_strategy(cfg, accelerator, log: Callable[[str], None]) -> Replicated:
    world = accelerator.num_processes
    return (Sharded if use_fsdp(cfg, accelerator, world, log) else Replicated)(accelerator)


def split_trainee_state(state: dict[str, torch.Tensor]) -> tuple[dict, dict | None]:
    """A trainee's state dict -> (model state, projector state or None), without their prefixes."""
    parts: dict[str, dict] = {"model": {}, "projector": {}}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        parts[head][rest] = value
    return parts["model"], parts["projector"] or None


def join_trainee_state(model: dict, projector: dict | None) -> dict[str, torch.Tensor]:
    return {**{f"model.{k}": v for k, v in model.items()},
            **{f"projector.{k}": v for k, v in (projector or {}).items()}}


class Replicated:
    """One process, or DDP: every process holds the whole trainee; accelerate wraps it and the optimizer."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator

    def prepare(self, trainee: nn.Module, ema: EMA, make_optimizer: Callable):
        ema.model.to(self.accelerator.device)
        optimizer = make_optimizer(trainee.parameters())
        return self.accelerator.prepare(trainee, optimizer)

    def unwrap(self, net: nn.Module) -> nn.Module:
        return self.accelerator.unwrap_model(net)

    def autocast(self):
        return contextlib.nullcontext()  # accelerate's wrapper autocasts the trainee's forward

    def before_micro_step(self, net: nn.Module, last: bool) -> None:
        """accelerate.accumulate skips DDP's gradient all-reduce until the last micro-batch."""

    def clip(self, net: nn.Module, max_norm: float | None) -> float:
        """Global gradient norm (clipped to ``max_norm`` when set)."""
        acc = self.accelerator
        if max_norm is not None:
            return float(acc.clip_grad_norm_(net.parameters(), max_norm))
        acc.unscale_gradients()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))

    def gather(self, net: nn.Module, optimizer, ema: EMA) -> FullState | None:
        """The checkpoint's tensors on the main process, None on the others."""
        if not self.accelerator.is_main_process:
            return None
        model, projector = split_trainee_state(self.unwrap(net).state_dict())
        return FullState(model, projector, ema.state_dict(), optimizer.state_dict())

    def load(self, net: nn.Module, optimizer, ema: EMA, full: FullState) -> None:
        self.unwrap(net).load_state_dict(join_trainee_state(full.model, full.projector), strict=True)
        optimizer.load_state_dict(full.optimizer)
        ema.load_state_dict(full.ema)

    def sampling_model(self, ema: EMA, build: Callable[[], nn.Module]) -> nn.Module | None:
        """The EMA model to sample from on the main process; None on the others."""
        return ema.model if self.accelerator.is_main_process else None


class Sharded(Replicated):
    """FSDP2 over all processes; our own wrapping and autocast, no accelerate wrapper."""

    def prepare(self, trainee: nn.Module, ema: EMA, make_optimizer: Callable):
        device = self.accelerator.device
        shard(trainee.to(device), trainee.model.blocks, device.type)
        shard(ema.model.to(device), ema.model.blocks, device.type)
        return trainee, make_optimizer(trainee.parameters())  # the optimizer must be built over the shards

    def unwrap(self, net: nn.Module) -> nn.Module:
        return net

    def autocast(self):
        return self.accelerator.autocast()

    def before_micro_step(self, net: nn.Module, last: bool) -> None:
        net.set_requires_gradient_sync(last)  # reduce-scatter the gradients once, after the last micro-batch

    def clip(self, net: nn.Module, max_norm: float | None) -> float:
        params = list(net.parameters())  # DTensor gradients: torch's norm reduces over the shards
        if max_norm is not None:
            return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        return float(full_tensor(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])))

    def gather(self, net: nn.Module, optimizer, ema: EMA) -> FullState | None:
        """A collective: every process gathers, the main one gets the full CPU tensors."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        options = _options(cpu_offload=True)
        trainee_sd, optim_sd = get_state_dict(net, optimizer, options=options)
        ema_sd = get_model_state_dict(ema.model, options=options)
        if not self.accelerator.is_main_process:
            return None
        model, projector = split_trainee_state(trainee_sd)
        return FullState(model, projector, ema_sd, numbered_optimizer_state(optim_sd, net, optimizer))

    def load(self, net: nn.Module, optimizer, ema: EMA, full: FullState) -> None:
        """Every process passes the full state (read from the checkpoint) and keeps its shards."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        # broadcast_from_rank0 would let only rank 0 read the files, but it hangs over gloo (CPU) here.
        set_state_dict(net, optimizer, model_state_dict=join_trainee_state(full.model, full.projector),
                       optim_state_dict=named_optimizer_state(full.optimizer, net), options=_options())
        set_model_state_dict(ema.model, full.ema, options=_options())
        for group, saved in zip(optimizer.param_groups, full.optimizer["param_groups"]):  # as saved (DCP lists
            group.update({k: v for k, v in saved.items() if k != "params"})               # tuples such as betas)

    def sampling_model(self, ema: EMA, build: Callable[[], nn.Module]) -> nn.Module | None:
        """A collective: the EMA gathered into a plain model on the main process."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(ema.model, options=_options(cpu_offload=True))
        if not self.accelerator.is_main_process:
            return None
        model = build().to(self.accelerator.device).eval()
        model.load_state_dict(state, strict=True)
        return model


def _options(cpu_offload: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def shard(root: nn.Module, blocks: nn.ModuleList, device_type: str) -> nn.Module:
    """FSDP2: shard each of ``blocks``, then the rest of ``root``, over the default group (in place).

    Parameters stay fp32 (mixed precision comes from autocast, as without sharding).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(root, mesh=mesh)
    return root


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` on every process (all-gathers a DTensor; a collective)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def numbered_optimizer_state(named: dict, net: nn.Module, optimizer) -> dict:
    """DCP's optimizer state (keyed by parameter name) in the plain ``optimizer.state_dict()`` layout."""
    index = {name: i for i, (name, _) in enumerate(net.named_parameters())}
    return {"state": {index[name]: v for name, v in named["state"].items()},
            "param_groups": optimizer.state_dict()["param_groups"]}


def named_optimizer_state(numbered: dict, net: nn.Module) -> dict:
    """The plain layout (parameters numbered in the trainee's order) keyed by parameter name for DCP."""
    names = [name for name, _ in net.named_parameters()]
    return {"state": {names[int(i)]: v for i, v in numbered["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in numbered["param_groups"]]}
