"""One warm start per Ray Train trial, however many workers it has.

Inside ``train_loop_per_worker`` every worker calls :func:`~keeper.torch_support.warm_start`. Only rank 0
asks the service for a parent (one choice and one hit per trial) and writes the architecture template; the
choice reaches the other ranks over the trial's own ``torch.distributed`` process group, as JSON bytes (plain
data: nothing is unpickled), each rank transforms the same parent with the same seed, and finally every
parameter and buffer is broadcast from rank 0, so all workers start from bitwise-identical weights.

Invariant: outside Ray Train, or with one worker, or without an initialized process group, these functions say
"rank 0 of 1" and do nothing, so ``warm_start`` behaves exactly as in a plain Tune trial.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist

from keeper.choice.selection import ParentChoice
from keeper.errors import ServiceError

__all__ = ["train_context", "rank_and_size", "share_choice", "sync_module"]


def train_context() -> Any:
    """The Ray Train context of this worker, or None outside a Ray Train worker."""
    if "ray.train" not in sys.modules:  # a Ray Train worker has imported it; importing it here costs seconds
        return None
    try:
        import ray.train

        ctx = ray.train.get_context()
        ctx.get_world_rank()  # a Tune-only or absent session raises or lacks this
        return ctx
    except Exception:  # not in a Train worker: Train's API raises various errors there
        return None


def rank_and_size() -> tuple[int, int]:
    """(this worker's rank, the number of workers sharing one warm start); (0, 1) unless under Ray Train with an
    initialized ``torch.distributed`` process group."""
    ctx = train_context()
    if ctx is None or not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return int(dist.get_rank()), int(dist.get_world_size())


def share_choice(choice: ParentChoice | BaseException | None) -> ParentChoice:
    """Rank 0's ``choice``, on every rank (others pass None). When rank 0 passes the exception its ask raised,
    every rank raises a ServiceError saying so, instead of waiting on a broadcast that never comes."""
    device = _device()
    if dist.get_rank() == 0:
        data = (json.dumps({"error": f"{type(choice).__name__}: {choice}"}) if isinstance(choice, BaseException)
                else choice.to_json()).encode()
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=0)
    d = json.loads(bytes(buf.cpu().numpy()).decode())
    if "error" in d:
        if isinstance(choice, BaseException):
            raise choice
        raise ServiceError(f"warm_start: rank 0 of this Ray Train trial could not ask for a parent ({d['error']}); "
                           "see rank 0's log")
    return ParentChoice.from_json(bytes(buf.cpu().numpy()))


def sync_module(module: Any) -> None:
    """Every parameter and buffer of ``module`` set to rank 0's values, in place."""
    device = _device()
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            moved = t.data.to(device)
            dist.broadcast(moved, src=0)
            if moved.data_ptr() != t.data.data_ptr():
                t.data.copy_(moved)


def _device() -> Any:
    """Where the process group's collectives run: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
