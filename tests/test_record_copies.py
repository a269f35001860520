"""The recorders' copy-saving paths on large states (stop 38, issue 24): the draws of a CPU
block written straight into the record arrays (no buffer, no per-chunk ``msync``), the spread's
groups reduced on views of the block and its partial group kept in one buffer, and
``IterationBlock.watched_x(view=True)``.  Each path is compared with the plain one bit for bit,
with a negative control."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from nrpt.recorders.draws import Draws
from nrpt.recorders.stats import SlotSpread, _welford
from nrpt.roles import IterationBlock


class _Block:
    """The parts of an :class:`IterationBlock` that the spread and the draws read."""

    watched_x = IterationBlock.watched_x

    def __init__(self, k0: int, slot_x: torch.Tensor, watched: list[int], P: int):
        U, R = slot_x.shape[:2]
        self.k0, self.slot_x, self.watched, self.U = k0, slot_x, watched, U
        g = torch.Generator().manual_seed(k0)
        self.slot_of = torch.stack([torch.randperm(P, generator=g).expand(R, P)
                                    for _ in range(U)]).contiguous()
        self.slot_energies = torch.randn(U, R, P, generator=g, dtype=slot_x.dtype)


class _It:
    def __init__(self, rows: torch.Tensor, watched: list[int]):
        self.rows, self.watched = rows, watched

    def slot_x(self, slots):
        return self.rows[:, [self.watched.index(s) for s in slots]].clone()


def _rows(K: int, R: int, S: int, dim: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(K * 7 + dim)
    return torch.randn(K, R, S, dim, generator=g, dtype=torch.float64) * 3.0 + 5.0


def _blocks(x: torch.Tensor, sizes: list[int], watched: list[int], P: int,
            drop: int | None = None):
    if drop is not None:
        x = torch.cat([x[:drop], x[drop + 1:]])
    out, i, j = [], 0, 0
    while i < x.shape[0]:
        u = sizes[j % len(sizes)]
        out.append(_Block(i, x[i:i + u].clone(), watched, P))
        i, j = i + u, j + 1
    return out


@pytest.mark.parametrize("slots", [[3], [2, 3], [0, 3]])  # views (consecutive), a copy
def test_spread_of_long_rows_by_blocks_is_the_one_by_one_spread(slots):
    # rows of 1100 numbers: the Welford path (WELFORD_ROWS); blocks that split the groups
    # (the partial group's buffer) and hold whole ones (reduced on views of the block)
    R, P, dim, K, watched = 2, 4, 550, 61, [0, 2, 3]
    x = _rows(K, R, len(watched), dim)
    ref = SlotSpread(R, P, dim, slots=slots)
    for k in range(K):
        ref.record(_It(x[k], watched))
    for sizes in ([8], [5, 1, 8, 3, 16, 2, 7], [17], [61]):
        got = SlotSpread(R, P, dim, slots=slots)
        for b in _blocks(x, sizes, watched, P):
            got.record_block(b)
            b.slot_x.fill_(7.0)  # the caller reuses its buffer: nothing of it is kept
        for a, c in zip(ref.state_dict().values(), got.state_dict().values(), strict=True):
            assert a == c if isinstance(a, int) else torch.equal(a, c)
        assert torch.equal(ref.sd(), got.sd()) and torch.equal(ref.mean, got.mean)
    bad = SlotSpread(R, P, dim, slots=slots)  # negative control: one row dropped
    for b in _blocks(x, [8], watched, P, drop=3):
        bad.record_block(b)
    assert not torch.equal(ref.mean, bad.mean)


def test_spread_checkpoint_with_a_partial_group_resumes_exactly():
    R, P, dim, watched = 1, 4, 1024, [0, 3]
    x = _rows(40, R, 2, dim)
    ref = SlotSpread(R, P, dim, slots=[3])
    for b in _blocks(x, [8], watched, P):
        ref.record_block(b)
    first = SlotSpread(R, P, dim, slots=[3])
    for b in _blocks(x[:13], [5], watched, P):
        first.record_block(b)
    assert first.state_dict()["rows"].shape[0] == 5  # a partial group waits
    resumed = SlotSpread(R, P, dim, slots=[3])
    resumed.load_state_dict(first.state_dict())
    for b in _blocks(x[13:], [9], watched, P):
        b.k0 += 13
        resumed.record_block(b)
    assert resumed.n == ref.n == 40
    assert torch.equal(resumed.sd(), ref.sd()) and torch.equal(resumed.mean, ref.mean)


def test_welford_on_a_strided_view_is_var_mean_of_the_copy():
    x = _rows(8, 1, 2, 2048)
    view = x[:, :, 1:2]  # not contiguous
    assert not view.is_contiguous()
    var, mean = _welford(view)
    want_var, want_mean = torch.var_mean(view.contiguous(), 0, correction=0)
    assert torch.equal(var, want_var) and torch.equal(mean, want_mean)
    assert not torch.equal(var, torch.var_mean(x[:, :, :1], 0, correction=0)[0])  # control
    graph = view.clone().requires_grad_()  # (a state still in a graph: its values, no graph)
    assert all(torch.equal(a, b) for a, b in zip(_welford(graph), (var, mean), strict=True))


def test_watched_x_view_is_the_copy_and_shares_memory():
    x = _rows(4, 2, 3, 5)
    b = _Block(0, x, [0, 4, 7], 8)
    assert b.watched_x([0, 4, 7]) is x
    for slots in ([4], [4, 7], [0, 4]):
        view = b.watched_x(slots, view=True)
        assert torch.equal(view, b.watched_x(slots))
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert b.watched_x(slots).untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    view = b.watched_x([0, 7], view=True)  # not consecutive: a copy
    assert view.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def _draws(K, R, P, dim, out=None, **kw):
    d = Draws(K, R, P, dim, out_dir=out, **kw)
    d.initial(torch.arange(P).expand(R, P))
    return d


@pytest.mark.parametrize("slots", ["target", "all"])
@pytest.mark.parametrize("thin", [1, 3])
def test_draws_of_cpu_blocks_are_the_buffered_draws(slots, thin, tmp_path):
    # the direct writes against the buffered path (what a block off the CPU takes), in memory
    # and in a run folder
    R, P, dim, K = 2, 4, 3, 50
    watched = list(range(P)) if slots == "all" else [0, 3]
    x = _rows(K, R, len(watched), dim)
    blocks = _blocks(x, [5, 1, 8, 3], watched, P)

    def run(out, buffered, drop=False):
        d = _draws(K, R, P, dim, out, thin=thin, slots=slots, chunk=7)
        if buffered:  # (the path of a block off the CPU)
            d._direct = lambda t: False
        for i, b in enumerate(blocks):
            if not (drop and i == 2):
                d.record_block(b)
        d.close()
        return [np.asarray(a).copy() for a in (d.samples, d.energies, d.index)]

    ref = run(None, buffered=True)
    for out in (None, tmp_path / "a"):
        if out is not None:
            out.mkdir()
        got = run(out, buffered=False)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(ref, run(None, False, drop=True),
                                                         strict=True))


def test_draws_sync_to_disk_only_at_checkpoints_and_close(tmp_path, monkeypatch):
    R, P, dim, K = 1, 4, 3, 64
    calls = []
    real = np.memmap.flush
    monkeypatch.setattr(np.memmap, "flush", lambda self: (calls.append(1), real(self))[1])
    watched = [0, 3]
    d = _draws(K, R, P, dim, tmp_path, chunk=4)
    blocks = _blocks(_rows(K, R, 2, dim), [8], watched, P)
    for b in blocks[:4]:
        d.record_block(b)
    assert calls == []  # 32 rows past a chunk of 4: no msync
    sums = d.state_dict()["checksums"]
    assert len(calls) == 3 and sums["samples"]["rows"] == 32  # one per file
    for b in blocks[4:]:
        d.record_block(b)
    d.close()
    assert len(calls) == 6


def test_rows_written_without_a_flush_survive_a_crash_of_the_process(tmp_path):
    # rows go into the shared file maps at once: a process that dies without flushing (no
    # msync, no close) leaves them in the files (the page cache)
    code = textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        from test_record_copies import _blocks, _draws, _rows
        d = _draws(40, 1, 4, 3, {str(tmp_path)!r}, chunk=1000)
        for b in _blocks(_rows(40, 1, 2, 3), [8], [0, 3], 4)[:3]:
            d.record_block(b)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    samples = np.load(tmp_path / "samples.npy")  # (the file still has the run's full length)
    want = _rows(40, 1, 2, 3)[:, 0, 0].numpy()
    assert np.array_equal(samples[:24], want[:24])
    assert not samples[24:].any()  # negative control: the rows never written are zeros
