"""One rule for every seed the training loop derives from ``train.seed``."""

from __future__ import annotations

import hashlib

SEED_BITS = 63  # torch.Generator.manual_seed takes up to 64 bits; 63 keeps every seed a positive int64


def derive_seed(seed: int, stream: str, *index: int) -> int:
    """The seed of one stream of draws: a hash of (run seed, stream name, indices).

    Streams used by the loop: ``("data-order", epoch)``, ``("noise", step)`` (times, noise and label
    dropout of a global batch) and ``("step", step, rank)`` (the global torch RNG during a step). Different
    names or indices never share a seed, and a seed depends on nothing else, so a resumed run and a run on N
    processes draw what an uninterrupted one-process run draws.
    """
    key = ":".join([stream, str(int(seed)), *(str(int(i)) for i in index)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> (64 - SEED_BITS)
