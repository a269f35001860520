"""Recorders fed ``U`` iterations at once (``record_block``, the fused loop's call) end in the
state ``U`` calls of ``record`` leave, bit for bit.  Real runs give the iterations (DEO, DEO_W
with a window of 4 so that the phase's ``active`` varies, and the headline SGD run with its
``C`` parameter and learning-rate adaptors); every comparison has a negative control (an
iteration dropped from the blocks)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from nrpt.diagnostics import RoundTripTracker
from nrpt.diagnostics.barrier import SlotEnergyRecorder
from nrpt.explorers.base import ReplicaState
from nrpt.recorders.draws import Draws
from nrpt.recorders.log_z import SteppingStone, StreamingLogSumExp
from nrpt.recorders.stats import RoundTrips, SlotSpread, SwapStats, Trace, ordered_sum
from nrpt.roles import Iteration, IterationBlock, PhaseDecision
from nrpt.run.build import build
from nrpt.run.config import RunConfig
from nrpt.run.sgpt import HEADLINE
from nrpt.swap.schemes import is_sweep

K = 150  # iterations per run: crosses StreamingLogSumExp's 64-term chunk twice
#: block sizes, cycled: U = 1, 3, 4, 8, 64 (the eager chunks' length on small states) and a mix
SIZES = {"1": [1], "3": [3], "4": [4], "8": [8], "64": [64],
         "mix": [5, 1, 8, 3, 16, 2, 7, 4, 40]}

CONFIGS = {
    "deo": dict(target="twenty-five-modes", chains=6, systems=3, explorer="rwmh", scheme="deo"),
    "deo-w": dict(target="twenty-five-modes", chains=6, systems=3, explorer="rwmh",
                  scheme="deo-w", window=4),
    "headline": {**HEADLINE, "chains": 8, "systems": 2},
}


def freeze(it: Iteration) -> Iteration:
    """A copy of ``it`` that later engine steps and adaptors cannot change (``lo`` / ``hi``
    kept: the sweep schemes' cached pairs, recognized by identity)."""
    st = it.state
    ds = [PhaseDecision(d.lo, d.hi, d.active.clone(), d.decision.clone(), d.accepted.clone(),
                        d.prob.clone()) for d in it.decisions]
    return Iteration(k=it.k, state=ReplicaState(st.x.clone(), st.v.clone(), st.base.clone()),
                     slot_of=it.slot_of.clone(), replica_at=it.replica_at.clone(),
                     schedule=it.schedule.clone(), step_size=it.step_size.clone(),
                     params={n: t.clone() for n, t in it.params.items()},
                     explore_accept=it.explore_accept.clone(), nonfinite=it.nonfinite.clone(),
                     decisions=ds, has_reference=it.has_reference)


def stack(its: list[Iteration], watched: list[int]) -> IterationBlock:
    """The block of the iterations ``its`` (as the fused loop would hand it over)."""
    def st(f):
        return torch.stack([f(it) for it in its])

    def dec(name):
        return st(lambda it: getattr(it.decisions[0], name))

    return IterationBlock(
        k0=its[0].k, v=st(lambda it: it.state.v), base=st(lambda it: it.state.base),
        slot_of=st(lambda it: it.slot_of), replica_at=st(lambda it: it.replica_at),
        schedule=st(lambda it: it.schedule), step_size=st(lambda it: it.step_size),
        params={n: torch.stack([it.params[n] for it in its]) for n in its[0].params},
        explore_accept=st(lambda it: it.explore_accept), nonfinite=st(lambda it: it.nonfinite),
        active=dec("active"), decision=dec("decision"), accepted=dec("accepted"),
        prob=dec("prob"), slot_x=st(lambda it: it.slot_x(watched)), watched=list(watched),
        has_reference=its[0].has_reference)


class Recorded:
    def __init__(self, name: str):
        cfg = RunConfig(**{**CONFIGS[name], "iterations": K, "figures": False})
        # blocks vs one by one of the same iterations: DEO_W's gate with Metropolis verdicts
        # (refused for sampling, biased) is kept for the active / accepted masks it makes
        run = build(cfg, allow_gate_bias=True)
        eng = run.engine
        self.R, self.P, self.dim = eng.R, eng.P, eng.dim
        self.slot_of0 = eng.slot_of.clone()
        self.its = []
        for _ in range(K):
            it = eng.step()
            for a in run.adaptors:
                eng.apply(a.observe(it))
            self.its.append(freeze(it))
        assert all(len(it.decisions) == 1 and is_sweep(it.decisions[0].lo, self.R, self.P)
                   for it in self.its)
        self.watched = list(range(self.P))

    def blocks(self, sizes: list[int], drop: int | None = None) -> list[IterationBlock]:
        its = [it for i, it in enumerate(self.its) if i != drop]
        out, i = [], 0
        for u in itertools.cycle(sizes):
            if i >= len(its):
                return out
            out.append(stack(its[i:i + u], self.watched))
            i += u


@pytest.fixture(scope="module")
def runs() -> dict[str, Recorded]:
    return {name: Recorded(name) for name in CONFIGS}


def feed(rec, data: Recorded, sizes=None, drop=None):
    """``rec`` after every iteration (``sizes`` None: one ``record`` each), or after blocks of
    ``sizes`` (cycled) through ``record_block``."""
    if sizes is None:
        for it in data.its:
            rec.record(it)
    else:
        for b in data.blocks(sizes, drop):
            rec.record_block(b)
    return rec


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor as integers (NaN equals NaN of the same bits)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t


def same(a, b, rtol=None) -> bool:
    """Equal states: tensors bit for bit (or to ``rtol``), containers item by item."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if rtol is None or not a.is_floating_point():
            return torch.equal(bits(a), bits(b))
        return torch.allclose(a, b, rtol=rtol, atol=0.0, equal_nan=True)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y, rtol) for x, y in zip(a, b, strict=True))
    return a == b


def check(make, data: Recorded, rtol=None, state=lambda r: r.state_dict()):
    """``make()`` fed one by one and by blocks of every size agree; dropping an iteration from
    the blocks does not (the negative control)."""
    ref = state(feed(make(), data))
    for name, sizes in SIZES.items():
        got = state(feed(make(), data, sizes))
        assert same(ref, got, rtol), f"blocks of {name} differ from record one by one"
    assert not same(ref, state(feed(make(), data, SIZES["mix"], drop=2)), rtol)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_swap_stats(runs, name):
    d = runs[name]
    check(lambda: SwapStats(d.R, d.P), d)
    if name == "deo-w":  # the window makes some pairs inactive in some iterations
        active = torch.stack([it.decisions[0].active for it in d.its])
        assert not bool(active.all()) and bool(active.any())


def test_ordered_sum_is_the_one_by_one_sum():
    g = torch.Generator().manual_seed(0)
    total = torch.randn(3, 5, generator=g, dtype=torch.float64) * 1e3
    scale = torch.logspace(-8, 8, 9, dtype=torch.float64)[:, None, None]
    terms = torch.randn(9, 3, 5, generator=g, dtype=torch.float64) * scale
    seq = total.clone()
    for t in terms:
        seq += t
    assert torch.equal(ordered_sum(total, terms), seq)
    assert not torch.equal(total + terms.sum(0), seq)  # the grouping matters here


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("slots", ["last", "all"])
def test_slot_spread(runs, name, slots):
    d = runs[name]
    chosen = [d.P - 1] if slots == "last" else [0, 2, d.P - 1]
    check(lambda: SlotSpread(d.R, d.P, d.dim, slots=chosen), d)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("every", [1, 5, 7])
@pytest.mark.parametrize("values", ["step_size", "schedule"])
def test_trace(runs, name, every, values):
    d = runs[name]
    check(lambda: Trace(every=every, values=values), d)
    if name == "headline":
        t = feed(Trace(every=every, values=values), d, SIZES["mix"])
        assert len(t.C) == len(t.k) == K // every  # "C" recorded at every record point


@pytest.mark.parametrize("name", ["deo", "deo-w"])
def test_stepping_stone(runs, name):
    d = runs[name]
    check(lambda: SteppingStone(d.R, d.P, reference_normalized=False), d)
    est = feed(SteppingStone(d.R, d.P, reference_normalized=False), d, SIZES["mix"]).estimate()
    assert bool(torch.isfinite(est["log_normalizer"]).all())


@pytest.mark.parametrize("batches", [0, 2])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_add_many_is_add_one_by_one(chunk, batches):
    g = torch.Generator().manual_seed(1)
    terms = 30.0 * torch.randn(41, 2, 3, generator=g, dtype=torch.float64)
    terms[3, 0, 0], terms[7, 1, 2], terms[9, 0, 1] = -np.inf, np.nan, np.inf
    one = StreamingLogSumExp((2, 3), chunk=chunk, batches=batches)
    for t in terms:
        one.add(t)
    many = StreamingLogSumExp((2, 3), chunk=chunk, batches=batches)
    i = 0
    for u in itertools.cycle([3, 1, 7, 2, 11]):
        if i >= len(terms):
            break
        many.add_many(terms[i:i + u])
        i += u
    assert same(one.state_dict(), many.state_dict())
    assert torch.equal(one.value(), many.value()) and torch.equal(one.invalid, many.invalid)
    if batches and chunk == 1:  # 41 chunks, K = 2: 2 batches of 16, 9 terms left over
        assert (one.n_batches, one.batch_chunks) == (2, 16)
        clean = terms[:32].masked_fill(~(terms[:32] < np.inf), -np.inf).view(2, 16, 2, 3)
        torch.testing.assert_close(one.batch_log_means(),
                                   torch.logsumexp(clean, 1) - np.log(16))
        assert torch.equal(bits(one.batch_log_means()), bits(many.batch_log_means()))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("max_rows,length", [(10, 64), (200, K), (4, 9)])
def test_slot_energy_recorder(runs, name, max_rows, length):
    d = runs[name]

    def make():
        r = SlotEnergyRecorder(d.R, d.P, max_rows=max_rows)
        r.start_segment(True, length)
        return r

    check(make, d)


@pytest.mark.parametrize("name", ["deo", "headline"])
def test_round_trips_default_block(runs, name):
    d = runs[name]
    check(lambda: RoundTrips(d.slot_of0, d.P), d)


def test_tracker_advance_is_pure_and_update_uses_it(runs):
    d = runs["deo-w"]
    stepped, carried = RoundTripTracker(d.slot_of0, d.P), RoundTripTracker(d.slot_of0, d.P)
    state = carried.carry()
    before = [t.clone() for t in state]
    for it in d.its:
        stepped.update(it.slot_of)
        new = RoundTripTracker.advance(state, it.slot_of, d.P - 1)
        assert all(torch.equal(a, b) for a, b in zip(state, before, strict=True))  # untouched
        state, before = new, [t.clone() for t in new]
    carried.set_carry(state, len(d.its))
    assert same(stepped.state_dict(), carried.state_dict())
    assert int(stepped.round_trips_a5.sum()) + int(stepped.restarts.sum()) > 0
    carried.set_carry(RoundTripTracker.advance(state, d.its[0].slot_of, d.P - 1), 1)
    assert not same(stepped.state_dict(), carried.state_dict())


def draws_state(rec: Draws) -> dict:
    rec.close()
    return {"samples": np.asarray(rec.samples), "energies": np.asarray(rec.energies),
            "index": np.asarray(rec.index), "rows": rec.valid_rows()}


def same_arrays(a: dict, b: dict) -> bool:
    return a["rows"] == b["rows"] and all(
        np.array_equal(a[k], b[k]) for k in ("samples", "energies", "index"))


@pytest.mark.parametrize("name", ["deo", "headline"])
@pytest.mark.parametrize("slots", ["target", "all"])
@pytest.mark.parametrize("thin,chunk", [(1, 512), (3, 10), (4, 7)])
def test_draws(runs, name, slots, thin, chunk, tmp_path):
    d = runs[name]
    count = itertools.count()

    def make(disk=True):
        out = tmp_path / f"run{next(count)}"
        out.mkdir()
        rec = Draws(K, d.R, d.P, d.dim, thin=thin, chunk=chunk, slots=slots,
                    out_dir=out if disk else None)
        rec.initial(d.slot_of0)
        return rec

    ref = draws_state(feed(make(), d))
    assert ref["rows"] == {"samples": K // thin, "energies": K // thin, "index": K + 1}
    for sizes in SIZES.values():
        assert same_arrays(ref, draws_state(feed(make(), d, sizes)))
    assert same_arrays(ref, draws_state(feed(make(disk=False), d, SIZES["mix"])))
    loaded = {k: np.load(tmp_path / "run0" / f"{k}.npy") for k in ("samples", "energies",
                                                                     "index")}
    assert all(np.array_equal(loaded[k], ref[k]) for k in loaded)
    assert not same_arrays(ref, draws_state(feed(make(), d, SIZES["mix"], drop=2)))


def test_draws_buffers_are_copies(runs):
    """The buffered draws outlive their block: overwriting the block's tensors after
    record_block (a loop reusing its buffers) leaves the records unchanged."""
    d = runs["deo"]
    ref, rec = (Draws(K, d.R, d.P, d.dim, thin=1, chunk=1000) for _ in range(2))
    ref.initial(d.slot_of0)
    rec.initial(d.slot_of0)
    feed(ref, d)
    for b in d.blocks([1, 4]):
        rec.record_block(b)
        for t in (b.slot_x, b.v, b.slot_energies, b.slot_of):
            t.fill_(7)
    assert same_arrays(draws_state(ref), draws_state(rec))


def test_round_trips_pending_rows_copies_and_checkpoint_between(runs):
    """RoundTrips keeps a chunked run's index rows until :attr:`RoundTrips.PENDING` iterations
    have come (one scan for them): the rows are copies (the caller may overwrite its block),
    and a checkpoint taken while rows wait, loaded into a fresh recorder, goes on as the
    uninterrupted one.  Negative control: a block overwritten before it is recorded changes
    the counts, so the comparison sees the rows."""
    d = runs["headline"]
    blocks = d.blocks([8])
    assert 8 * 3 < RoundTrips.PENDING  # (the checkpoint below falls while rows wait)
    ref = feed(RoundTrips(d.slot_of0, d.P), d)
    rec = RoundTrips(d.slot_of0, d.P)
    for b in blocks[:3]:
        rec.record_block(b)
        b.slot_of.fill_(0)  # the caller reuses its buffer
    assert len(rec._pending) == 24
    resumed = RoundTrips(d.slot_of0, d.P)
    resumed.load_state_dict(rec.state_dict())
    for b in d.blocks([8])[3:]:
        rec.record_block(b)
        resumed.record_block(b)
    assert int(ref.counts()["round_trips"].sum()) + int(ref.counts()["restarts"].sum()) > 0
    assert same(ref.state_dict(), rec.state_dict())
    assert same(ref.state_dict(), resumed.state_dict())
    bad = RoundTrips(d.slot_of0, d.P)
    for i, b in enumerate(d.blocks([8])):
        if i == 2:
            b.slot_of.fill_(0)
        bad.record_block(b)
    assert not same(ref.state_dict(), bad.state_dict())


@pytest.mark.parametrize("shape", [(8, 1, 2, 1024), (8, 3, 2, 700), (3, 1, 1, 5000),
                                   (1, 2, 1, 2048), (8, 1, 16, 2)])
def test_welford_is_torch_var_mean(shape):
    # the spread's variance and mean of a group of long rows by elementwise Welford steps
    # (recorders.stats._welford) are torch.var_mean's numbers bit for bit, also with an
    # infinite entry; negative control: the same steps with a fused multiply-add differ
    from nrpt.recorders.stats import WELFORD_ROWS, _var_mean, _welford

    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, dtype=torch.float64, generator=g) * 3.7 + 11.0
    x[0, 0, 0, 0] = math.inf
    var, mean = _welford(x)
    want_var, want_mean = torch.var_mean(x, 0, correction=0)
    assert torch.equal(var.nan_to_num(), want_var.nan_to_num())
    assert torch.equal(mean.nan_to_num(), want_mean.nan_to_num())
    assert torch.equal(mean.isnan(), want_mean.isnan()) and torch.equal(var.isnan(),
                                                                        want_var.isnan())
    used = _var_mean(x)
    assert torch.equal(used[1].nan_to_num(), want_mean.nan_to_num())
    assert (x[0].numel() >= WELFORD_ROWS) == (shape != (8, 1, 16, 2))
    if shape[0] > 2:
        m, m2 = torch.zeros_like(x[0]), torch.zeros_like(x[0])
        for k in range(shape[0]):
            d = x[k] - m
            m = m + d / float(k + 1)
            m2 = torch.addcmul(m2, d, x[k] - m)
        assert not torch.equal((m2 / shape[0]).nan_to_num(), want_var.nan_to_num())


@pytest.mark.parametrize("shape", [(1, 15), (3, 7), (2, 255), (32, 7)])
@pytest.mark.parametrize("blocks", [[64], [5, 64, 59, 128], [200]])
def test_add_many_together_is_one_stream_at_a_time(shape, blocks):
    # the log Z recorder's four sums reduced together (one logsumexp over the stacked
    # buffers) give each stream's own numbers bit for bit, with infinite and NaN terms;
    # streams out of step take the one-at-a-time path; negative control: two streams'
    # terms exchanged differ
    from nrpt.recorders.log_z import add_many_together

    g = torch.Generator().manual_seed(len(blocks) + shape[1])
    n = sum(blocks)
    terms = [torch.randn(n, *shape, generator=g, dtype=torch.float64) for _ in range(4)]
    terms[1][3, 0, 0], terms[2][n - 1, -1, -1], terms[3][9, 0, -1] = -np.inf, np.nan, np.inf

    def streams():
        return [StreamingLogSumExp(shape, batches=2) for _ in range(4)]

    one, joint = streams(), streams()
    i = 0
    for u in blocks:
        for s, t in zip(one, terms, strict=True):
            s.add_many(t[i:i + u])
        add_many_together(joint, torch.stack([t[i:i + u] for t in terms]))
        i += u
    for a, b in zip(one, joint, strict=True):
        assert same(a.state_dict(), b.state_dict())
        assert torch.equal(bits(a.value()), bits(b.value()))
    late = streams()  # out of step: one stream at a time, the same numbers
    late[0].add_many(terms[0][:1])
    add_many_together(late, torch.stack([t[1:] if j == 0 else t[:n - 1]
                                         for j, t in enumerate(terms)]))
    for s, t in zip(late[1:], terms[1:], strict=True):
        s.add_many(t[n - 1:])
    assert all(same(a.state_dict(), b.state_dict()) for a, b in zip(one, late, strict=True))
    mixed = streams()  # two streams' terms exchanged: the comparison sees it
    add_many_together(mixed, torch.stack([terms[0], terms[1], terms[3], terms[2]]))
    assert not same(one[2].state_dict(), mixed[2].state_dict())


def test_reduce_terms_all_finite_is_the_masked_reduction():
    # the all-finite shortcut (no mask, no counts) gives the masked reduction's numbers; a
    # non-finite term takes the masked path and is counted
    from nrpt.recorders.log_z import _reduce_terms

    g = torch.Generator().manual_seed(5)
    terms = torch.randn(64, 3, 15, generator=g, dtype=torch.float64)
    lse, bad, zeros = _reduce_terms(terms, 0)
    assert bad is None and zeros is None
    masked = torch.logsumexp(terms.masked_fill(~(terms < np.inf), -np.inf), 0)
    assert torch.equal(bits(lse), bits(masked))
    terms[4, 1, 2], terms[9, 0, 0] = np.nan, -np.inf
    lse, bad, zeros = _reduce_terms(terms, 0)
    assert int(bad.sum()) == 1 and int(zeros.sum()) == 1 and bool(lse.isfinite().all())
