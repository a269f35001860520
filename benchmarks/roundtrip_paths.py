"""Time the round-trip tracker's paths, us per iteration: ``events`` (``update_block`` on the
CPU), ``tables`` (the prefix scan a GPU takes) and ``update`` (one :meth:`advance` per
iteration), on a synthetic DEO index process (even / odd sweeps, each swap accepted with
probability 0.7), blocks of 64, one thread.

Two source trees, each timed in fresh processes, interleaved A, B, B, A, ...; each process the
median of 3 repeats of every path; printed: the medians over the pairs of CPU (process_time)
and wall us per iteration, with the ratio B / A::

    OMP_NUM_THREADS=1 python benchmarks/roundtrip_paths.py --trees BASE/src NEW/src --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = ((1, 16), (4, 16), (16, 16))  # (R, P): R P = 16, 64, 256
BLOCK = 64


def _index_process(n_iter: int, R: int, P: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    at = np.tile(np.arange(P), (R, 1))  # at[r, slot]: the replica there
    rows = []
    for k in range(n_iter + 1):
        slot_of = np.empty_like(at)
        np.put_along_axis(slot_of, at, np.arange(P)[None].repeat(R, 0), axis=1)
        rows.append(slot_of)
        lower = np.arange(k % 2, P - 1, 2)
        for r in range(R):
            ok = lower[rng.random(lower.size) < 0.7]
            at[r, ok], at[r, ok + 1] = at[r, ok + 1].copy(), at[r, ok].copy()
    return np.stack(rows)


def _time_one(n_iter: int) -> dict:
    import torch

    from nrpt.diagnostics import RoundTripTracker

    torch.set_num_threads(1)
    out = {}
    for R, P in SIZES:
        index = torch.as_tensor(_index_process(n_iter, R, P, seed=R * P))
        rest = index[1:]

        def events(t, rest=rest):
            for a in range(0, n_iter, BLOCK):
                assert t._advance_events(rest[a:a + BLOCK])

        def tables(t, rest=rest):
            for a in range(0, n_iter, BLOCK):
                t._advance_block(rest[a:a + BLOCK])

        def update(t, rest=rest):
            for u in range(n_iter):
                t.update(rest[u])

        for name, path in (("events", events), ("tables", tables), ("update", update)):
            cpu, wall, states = [], [], []
            for _ in range(3):
                t = RoundTripTracker(index[0], P)
                c0, w0 = time.process_time(), time.perf_counter()
                path(t)
                cpu.append((time.process_time() - c0) / n_iter * 1e6)
                wall.append((time.perf_counter() - w0) / n_iter * 1e6)
                states.append(int(t.round_trips.sum() + t.restarts.sum()
                                  + t.round_trips_a5.sum()))
            out[f"{name} RP={R * P}"] = (statistics.median(cpu), statistics.median(wall),
                                         states[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trees", nargs=2, metavar=("A", "B"))
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--n", type=int, default=1280, help="iterations per repeat")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_time_one(args.n)))
        return
    res: dict[str, list] = {"A": [], "B": []}
    for p in range(args.pairs):
        for side in ("AB" if p % 2 == 0 else "BA"):
            tree = args.trees[0 if side == "A" else 1]
            env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
            run = subprocess.run([sys.executable, __file__, "--child", "--n", str(args.n)],
                                 env=env, capture_output=True, text=True, check=True)
            res[side].append(json.loads(run.stdout))
    print(f"load average {os.getloadavg()}; us per iteration, medians of {args.pairs} "
          f"processes; A = {args.trees[0]}, B = {args.trees[1]}")
    print(f"{'path':16s} {'cpu A':>8s} {'cpu B':>8s} {'B/A':>6s} {'wall A':>8s} {'wall B':>8s}"
          f" {'B/A':>6s}  counts equal")
    for key in res["A"][0]:
        ca = statistics.median(r[key][0] for r in res["A"])
        cb = statistics.median(r[key][0] for r in res["B"])
        wa = statistics.median(r[key][1] for r in res["A"])
        wb = statistics.median(r[key][1] for r in res["B"])
        same = {r[key][2] for r in res["A"] + res["B"]}
        print(f"{key:16s} {ca:8.2f} {cb:8.2f} {cb / ca:6.3f} {wa:8.2f} {wb:8.2f} "
              f"{wb / wa:6.3f}  {len(same) == 1}")


if __name__ == "__main__":
    main()
