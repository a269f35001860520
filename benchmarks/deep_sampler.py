"""Minibatch indices of the deep runs: the keyed epoch sampler (nrpt.deep.energy.EpochBatches,
one keyed permutation per replica and epoch, sliced per iteration) against the full-width
draw it replaced (nrpt.energy.estimators.batch_indices: an [R, P, N] uniform + topk per
iteration), at the CIFAR shape (N = 50000, B = 128, P = 10), per iteration.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/deep_sampler.py [pairs]

Paired and interleaved (old, new, old, new, ...): each measurement is one epoch's iterations
(391), median over the pairs of CPU seconds (process_time) and wall seconds per iteration."""

from __future__ import annotations

import statistics
import sys
import time

from nrpt.deep.energy import EpochBatches
from nrpt.energy.estimators import batch_indices
from nrpt.rng import Key

N, B, P = 50_000, 128, 10
E = -(-N // B)


def old(epoch: int) -> None:
    for j in range(E):
        batch_indices((1, P), N, B, False, Key((0, epoch * E + j, 0, 1)), "cpu")


SAMPLER = EpochBatches(N, B)  # (its cache of permutations lives across the measurements)


def new(epoch: int) -> None:
    for j in range(E):
        SAMPLER(Key((0, epoch * E + j, 0, 1)), (1, P), "cpu")


def main(pairs: int = 5) -> None:
    res: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    for i in range(pairs):
        for name, fn in (("old", old), ("new", new)):
            c0, w0 = time.process_time(), time.perf_counter()
            fn(i + 1)
            res[name].append(((time.process_time() - c0) / E, (time.perf_counter() - w0) / E))
    for name, rows in res.items():
        cpu = statistics.median(r[0] for r in rows) * 1e3
        wall = statistics.median(r[1] for r in rows) * 1e3
        print(f"{name}: {cpu:.3f} ms CPU, {wall:.3f} ms wall per iteration (median of {pairs})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
