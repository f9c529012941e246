"""The tiny distributed helper (after edm2's torch_utils/distributed.py).

A plain `python sample.py ...` is one process (rank 0 of world size 1); the same file under
`accelerate launch --num_processes 8 sample.py ...` (or `torchrun --nproc_per_node 8 sample.py ...`) is
one of 8. The state comes from accelerate's `PartialState`, created on first use, so nothing here needs
a launcher.
"""

from __future__ import annotations

import torch


def _state():
    """accelerate's PartialState: a shared singleton, initialised by the first call (cheap afterwards)."""
    from accelerate import PartialState

    # Without a GPU, cpu=True lets accelerate join a launcher's processes over gloo (CPU tests, torchrun).
    return PartialState(cpu=not torch.cuda.is_available())


def rank() -> int:
    return _state().process_index


def world_size() -> int:
    return _state().num_processes


def is_main() -> bool:
    return _state().is_main_process


def device() -> torch.device:
    """This process's device: its GPU under a launcher, cuda:0 or the CPU for a plain run."""
    return _state().device


def barrier() -> None:
    """Wait until every process gets here (a no-op for world size 1)."""
    if world_size() > 1:
        _state().wait_for_everyone()


def print0(*args, **kwargs) -> None:
    """print() on the main process only."""
    if is_main():
        print(*args, **kwargs, flush=True)
