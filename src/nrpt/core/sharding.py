"""Replicas across processes on ``torch.distributed``: same algorithm, sharded replicas.

Each rank holds a fixed contiguous block of replicas (:class:`nrpt.rng.Block`) of every system,
``[R, P / world, dim]``.  Per iteration every rank explores its replicas (full-width keyed
draws, sliced), the ranks ``all_gather`` the per-replica scalars (``v``, ``base``, explorer
acceptance and non-finite counts, ``energy_var``, a stop flag) into ``[R, P, m]``, and every
rank makes the same swap decisions, so ``slot_of`` agrees everywhere.  Rows at the slots
recorders declare (``reads_slots``) are gathered once per iteration
(:meth:`nrpt.roles.Iteration.slot_x`).  Checkpoints gather the full state; rank 0 writes it
(N processes resume on M).  For targets whose per-row evaluation does not depend on batch size
(the built-ins), results are bit for bit those of one process.

Launch: ``nrpt run --nproc N ...`` (gloo) or ``torchrun --nproc-per-node N -m nrpt run ...``;
``nrpt.sample``/``run_config`` under ``torchrun`` (``WORLD_SIZE`` > 1) run distributed.  Rank 0
owns the run folder and returns the :class:`~nrpt.run.api.Result`; other ranks return one with
empty arrays whose ``summary`` holds only ``rank`` and ``interrupted``.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from typing import cast

import torch

from nrpt.core.engine import PTEngine
from nrpt.explorers import Noise, ReplicaState
from nrpt.rng import Block

__all__ = ["ShardedEngine", "Comm", "from_env", "launch", "spawn", "block_of", "block_size",
           "check_world", "local_device"]


def block_size(world: int, P: int) -> int:
    """Replicas per rank: blocks of ``ceil(P / world)``, the last ranks may hold fewer."""
    return math.ceil(P / world)


def block_of(rank: int, world: int, P: int) -> Block:
    """Rank ``rank``'s contiguous block of ``P`` replicas (:func:`block_size`)."""
    size = block_size(world, P)
    lo = min(P, rank * size)
    return Block(lo, min(P, lo + size), P)


def check_world(world: int, P: int) -> None:
    if world > P:
        raise ValueError(f"{world} processes for {P} chains: use at most one process per "
                         f"chain (nproc <= chains)")


class Comm:
    """The process group's collectives, as nrpt uses them (only copies, no reductions)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.backend = dist.get_backend(group)

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, world={self.world}, backend={self.backend!r})"

    def block(self, P: int) -> Block:
        check_world(self.world, P)
        return block_of(self.rank, self.world, P)

    def _all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(parts, t, group=self.group)
        return parts

    def owner(self, replicas: torch.Tensor, P: int) -> torch.Tensor:
        """The rank holding each of ``replicas``."""
        return replicas // block_size(self.world, P)

    def gather_replicas(self, t: torch.Tensor, P: int) -> torch.Tensor:
        """A per-replica tensor ``[R, local, ...]`` from every rank -> ``[R, P, ...]``."""
        size = block_size(self.world, P)
        width = t.shape[1]
        if width < size:  # pad the short last blocks to the common size
            pad = torch.zeros((t.shape[0], size - width, *t.shape[2:]), dtype=t.dtype,
                              device=t.device)
            t = torch.cat([t, pad], dim=1)
        parts = self._all_gather(t)
        return torch.cat(parts, dim=1)[:, :P]

    def gather_rows(self, local: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        """Rows ``[R, S, ...]`` each held by rank ``owner[R, S]`` (other ranks' entries are
        ignored) -> the owners' rows on every rank."""
        stacked = torch.stack(self._all_gather(local))  # [world, R, S, ...]
        idx = owner.reshape(1, *owner.shape, *([1] * (local.dim() - owner.dim())))
        return stacked.gather(0, idx.expand(1, *local.shape)).squeeze(0)

    def check_same(self, text: str, what: str) -> None:
        """Refuse to run when the ranks disagree on ``text`` (e.g. the config)."""
        digest = hashlib.sha256(text.encode()).digest()[:8]
        mine = torch.tensor(list(digest), dtype=torch.int64)
        if self.backend == "nccl":
            mine = mine.cuda()
        allv = torch.stack(self._all_gather(mine))
        if not bool((allv == allv[0]).all()):
            raise ValueError(f"the {self.world} processes were given different {what}s; every "
                             f"rank must run the same {what}")

    def share(self, obj):
        """Rank 0's ``obj`` on every rank (small messages: what rank 0 found in the run
        folder).  Pickled between the run's own processes only."""
        box = [obj]
        self.dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)


class ShardedEngine(PTEngine):
    """:class:`~nrpt.core.engine.PTEngine` whose replicas are spread over the processes of
    ``comm``: this process holds the block ``[R, P_local, ...]`` of the state; the per-replica
    scalars are gathered once per iteration (with the stop flag) and everything from the swaps
    on runs on full ``[R, P]`` tensors, identically on every rank.  The single-process step
    with its hooks overridden (:mod:`nrpt.core.engine`); :meth:`unshard` makes it that engine
    again."""

    def __init__(self, target, path, *args, comm: Comm, **kwargs):
        self.comm, self.block = comm, comm.block(path.n_slots)
        self._requested = self._agreed = False
        self._row_cache: tuple[int, torch.Tensor] | None = None
        super().__init__(target, path, *args, **kwargs)

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        return self.block.take(t)

    def _noise(self, k: int) -> Noise:
        return Noise(self.seed, k, self.R, self.block.width, self.device, self.block)

    def _gather(self, accept, nonfinite):
        """One gather of the per-replica scalars (``v``, ``base``, acceptance, non-finite
        counts, ``[R, P]`` buffers, the stop flag) -> ``(view, accept, nonfinite)``."""
        st, R, w = self.state, self.R, self.block.width
        names = sorted(n for n, t in st.extras.items() if tuple(t.shape) == (R, w))
        flag = torch.full((R, w), float(self._requested), dtype=self.dtype, device=self.device)
        cols = [st.v, st.base, accept, nonfinite.to(self.dtype), flag,
                *(st.extras[n].to(self.dtype) for n in names)]
        full = self.comm.gather_replicas(torch.stack(cols, dim=-1), self.P)  # [R, P, m]
        self._agreed = bool(full[..., 4].any())
        extras = {n: full[..., 5 + i].to(st.extras[n].dtype) for i, n in enumerate(names)}
        x = torch.empty((R, self.P, self.dim), dtype=self.dtype, device="meta")
        view = ReplicaState(x, full[..., 0], full[..., 1], extras)
        return view, full[..., 2], full[..., 3].long()

    def should_stop(self, flag: bool) -> bool:
        self._requested = flag  # travels with the next iteration's scalars
        return self._agreed

    def step(self):
        it = super().step()
        it.rows = self._slot_rows
        return it

    def watch(self, slots) -> None:
        super().watch(slots)
        self._row_cache = None

    def _slot_rows(self, slots: list[int]) -> torch.Tensor:
        """Positions at ``slots`` after this iteration's swaps: the watched slots' rows come
        from one gather per iteration, others are gathered apart."""
        if not all(s in self.watched for s in slots):
            return self.rows(self.replica_at[:, slots])
        if self._row_cache is None or self._row_cache[0] != self.k:
            self._row_cache = (self.k, self.rows(self.replica_at[:, self.watched]))
        return self._row_cache[1][:, [self.watched.index(s) for s in slots]]

    def rows(self, replicas: torch.Tensor) -> torch.Tensor:
        """Positions ``[R, S, dim]`` of ``replicas[R, S]`` (a collective: every rank calls it
        with the same argument)."""
        R, S = replicas.shape
        lo, hi, w = self.block.lo, self.block.hi, self.block.width
        mine = (replicas >= lo) & (replicas < hi)
        if w:
            local = (replicas - lo).clamp(0, w - 1)
            x = self.state.x.gather(1, local[..., None].expand(R, S, self.dim))
            x = torch.where(mine[..., None], x, torch.zeros_like(x))
        else:
            x = torch.zeros((R, S, self.dim), dtype=self.dtype, device=self.device)
        return self.comm.gather_rows(x, self.comm.owner(replicas, self.P))

    def _full_state(self) -> ReplicaState:
        """The whole state ``[R, P, ...]`` on every rank (a collective)."""
        st, P = self.state, self.P
        g = self.comm.gather_replicas
        return ReplicaState(g(st.x, P), g(st.v, P), g(st.base, P),
                            {n: g(t, P) for n, t in st.extras.items()})

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        self._row_cache = None

    def unshard(self) -> None:
        """Gather the whole state onto every rank and go on as the single-process engine (the
        end of a distributed run: summaries and outputs read the full state)."""
        self.state = self._full_state()
        for name in ("comm", "block", "_requested", "_agreed", "_row_cache"):
            delattr(self, name)
        self.__class__ = PTEngine  # type: ignore[assignment]


def from_env(device: str = "cpu") -> Comm | None:
    """The :class:`Comm` of the current ``torch.distributed`` process group, initialising it
    from the ``torchrun`` environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ...) when
    needed; ``None`` for a single process."""
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        backend = "nccl" if str(device).startswith("cuda") else "gloo"
        dist.init_process_group(backend)
        # tear the group down before the interpreter does: a gloo group destroyed during
        # interpreter shutdown can abort the process ("terminate called without an active
        # exception", exit -6) after the run itself has finished
        atexit.register(_destroy)
    if dist.get_world_size() <= 1:
        return None
    return Comm()


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def local_device(device: str) -> str:
    """``cuda`` -> ``cuda:LOCAL_RANK`` under a multi-process launch (one GPU per process)."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``python -m nrpt *argv`` in ``nproc`` local processes (see :func:`spawn`)."""
    return spawn(nproc, [sys.executable, "-m", "nrpt", *argv])


def spawn(nproc: int, command: list[str]) -> int:
    """Run ``command`` in ``nproc`` local processes with the ``torchrun`` environment (gloo on
    CPU, one GPU each with ``device = "cuda"``) and return rank 0's exit status (the first
    non-zero one if rank 0 succeeded but another failed).  SIGINT / SIGTERM to this process
    are passed to every rank; the ranks agree on the iteration to stop after (the stop flag
    travels with the gathered scalars), checkpoint and exit 130."""
    if isinstance(nproc, bool) or int(nproc) != nproc or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1; got {nproc!r}")
    port = _free_port()
    procs: list[subprocess.Popen] = []

    def forward(signum, frame):  # a stop request for the parent is one for every rank
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(int(nproc)):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(command, env=env, preexec_fn=_stop_with_parent))
        codes = _wait(procs)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
    if codes[0] != 0:
        return codes[0]
    return next((c for c in codes if c != 0), 0)


def _stop_with_parent() -> None:
    """(Linux) a rank gets SIGTERM when the launcher dies, so no rank outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: seconds the other ranks get to finish once one rank has failed (they are usually blocked in
#: a collective that can no longer complete) before they are killed
FAILURE_GRACE_S = 10.0


def _wait(procs: list[subprocess.Popen]) -> list[int]:
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return cast("list[int]", codes)
        if failed_at is None and any(c not in (None, 0, 130) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
