"""The ``tail-acceptance`` health finding (issue 25, gp_pois_regr): slot 0's explorer
acceptance collapses in a coordinate's tail where a funnel's neck begins
(:mod:`nrpt.recorders.tails`, :func:`nrpt.report.health.check_run`).

Why it exists: on gp_pois_regr every default run under-samples ``alpha``'s upper tail (sd ratio
0.84-0.88 against posteriordb's reference) while R-hat (1.011 on 1 of 13 coordinates) and the
tail ESS barely complain; the cause measured there is MALA's acceptance falling from 0.30 in
the bulk of ``log alpha`` to 0.05 between its 97 % and 99 % quantiles and 0 above.

Each check has a negative control: the recorder's pairing against a shifted pairing, the
health rule below its count / above its ratio, and end to end Neal's funnel (which fires)
against the same funnel non-centred (a Gaussian: which must not)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from nrpt.recorders.tails import K, TailAcceptance
from nrpt.report import health
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig

F64 = torch.float64


def _feed(rec: TailAcceptance, x: torch.Tensor, a: torch.Tensor, chunks) -> None:
    i = 0
    for c in chunks:
        rec._take(x[i:i + c], a[i:i + c])
        i += c
    assert i == x.shape[0]


def _rows(seed=0, U=400, R=2, d=3):
    """Positions ``x[U, R, d]`` and acceptances that are 0 when the step *started* (the
    previous row) with coordinate 1 above 1.5, else 0.8."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(U, R, d, generator=g, dtype=F64)
    start_hi = torch.cat([torch.zeros(1, R, dtype=torch.bool), x[:-1, :, 1] > 1.5])
    a = torch.where(start_hi, torch.zeros(U, R, dtype=F64), torch.full((U, R), 0.8, dtype=F64))
    return x, a


def test_recorder_pairs_each_acceptance_with_the_position_the_step_started_from():
    """Thresholds from the first segment (N(0, 1) rows: about +-2), then the second segment's
    acceptance in coordinate 1's upper tail is 0 (the rule that made it), elsewhere 0.8; the
    same numbers whatever the chunking.  Negative control: pairing each acceptance with the
    position *after* the step (the obvious off-by-one) gives a non-zero tail acceptance."""
    x1, a1 = _rows(0)
    x2, a2 = _rows(1, U=4000)
    out = []
    for chunks in ([400], [1] * 400, [7, 393]):
        rec = TailAcceptance(R=2, dim=3)
        _feed(rec, x1, a1, chunks)
        rec.start_segment(True)
        assert rec.hi is not None and abs(float(rec.hi[1]) - K) < 0.4
        _feed(rec, x2, a2, [4000] if chunks == [400] else [13, 3987])
        out.append(rec.stats())
    s = out[0]
    for other in out[1:]:  # chunking does not matter
        for k in ("n", "acceptance"):
            assert other[k] == pytest.approx(s[k], rel=1e-12)
        for k in ("n_hi", "acceptance_hi", "n_lo"):
            np.testing.assert_allclose(other[k], s[k], rtol=1e-12)
    assert s["n_hi"][1] >= 50 and s["acceptance_hi"][1] == 0.0
    assert s["acceptance_hi"][0] == pytest.approx(0.8, abs=0.1)  # other coordinates: bulk-like
    assert s["acceptance_lo"][1] == pytest.approx(0.8, abs=1e-12)
    # negative control: acceptances paired with the end positions (shifted by one row)
    rec = TailAcceptance(R=2, dim=3)
    rec._take(x1, a1)
    rec.start_segment(True)
    rec._take(x2[1:], a2[:-1])  # a[k] now sits with x[k] instead of x[k - 1]
    assert rec.stats()["acceptance_hi"][1] > 0.3


def test_recorder_state_round_trip_gives_the_same_stats():
    x1, a1 = _rows(0)
    x2, a2 = _rows(1, U=600)
    rec = TailAcceptance(R=2, dim=3)
    rec._take(x1, a1)
    rec.start_segment(True)
    rec._take(x2[:300], a2[:300])
    other = TailAcceptance(R=2, dim=3)
    other.load_state_dict(rec.state_dict())
    for r in (rec, other):
        r._take(x2[300:], a2[300:])
    np.testing.assert_array_equal(rec.stats()["acceptance_hi"], other.stats()["acceptance_hi"])
    assert rec.stats()["n"] == other.stats()["n"] == 2 * 600  # (R = 2) every row has a start


def test_recorder_counts_entries_into_a_tail_not_iterations_there():
    """Starts 0, 2, 2, 0, 2, 0, -2 (thresholds +-1): the upper tail is entered twice over three
    iterations there, the lower once; the same counts when the rows come in two chunks split
    inside a visit (the visit is not counted twice)."""
    xs = torch.tensor([0.0, 2.0, 2.0, 0.0, 2.0, 0.0, -2.0, 0.0], dtype=F64)[:, None, None]
    a = torch.full((8, 1), 0.5, dtype=F64)
    for chunks in ([8], [3, 5], [1] * 8):
        rec = TailAcceptance(R=1, dim=1)
        rec.lo, rec.hi = torch.tensor([-1.0], dtype=F64), torch.tensor([1.0], dtype=F64)
        _feed(rec, xs, a, chunks)
        st = rec.stats()
        assert (st["n_hi"][0], st["entries_hi"][0]) == (3.0, 2.0), chunks
        assert (st["n_lo"][0], st["entries_lo"][0]) == (1.0, 1.0), chunks


def _stats(a_hi=0.05, n_hi=40.0, a0=0.4, n=2000.0, d=3, entries=12.0):
    return {"n": n, "acceptance": a0, "k": 2.0,
            "entries_hi": np.array([entries] + [20.0] * (d - 1)),
            "entries_lo": np.full(d, 20.0),
            "n_hi": np.array([n_hi] + [50.0] * (d - 1)),
            "n_lo": np.full(d, 50.0),
            "acceptance_hi": np.array([a_hi] + [0.5] * (d - 1)),
            "acceptance_lo": np.full(d, 0.5)}


def test_health_rule_fires_on_a_collapsed_tail_only():
    """Fires at 0.05 / 0.4 with 40 draws (2 %) in 12 visits to the tail and names the
    coordinate and side; negative controls: the same ratio with fewer than TAIL_MIN_DRAWS
    draws, fewer than TAIL_MIN_ENTRIES visits, under TAIL_MIN_FRACTION of the draws, a tail
    acceptance at 0.5 of the overall (above TAIL_RATIO), an inexact (SG) run."""
    f = health.check_run(tail_acceptance=_stats())
    assert [x.code for x in f] == ["tail-acceptance"]
    assert "coordinate 0 is above its mean + 2 sd" in f[0].message
    assert "0.05" in f[0].message and "40 of 2000 draws in 12 visits" in f[0].message
    named = health.check_run(tail_acceptance={**_stats(), "names": ["log_alpha", "b", "c"]})
    assert "coordinate 0 (log_alpha) is above" in named[0].message
    assert health.check_run(tail_acceptance=_stats(n_hi=health.TAIL_MIN_DRAWS - 1)) == []
    # one replica stuck in the tail (few separate visits), or a tail holding too few draws
    assert health.check_run(tail_acceptance=_stats(entries=health.TAIL_MIN_ENTRIES - 1)) == []
    assert health.check_run(tail_acceptance=_stats(n=40.0 / (0.9 * health.TAIL_MIN_FRACTION))) == []
    assert health.check_run(tail_acceptance=_stats(a_hi=0.2)) == []
    assert health.check_run(tail_acceptance=_stats(), exact=False) == []
    assert health.check_run(tail_acceptance=_stats(a_hi=math.nan, n_hi=0.0)) == []


def test_tail_of_a_tuned_gaussian_is_not_slower_than_its_bulk():
    """The rule's premise, at MALA's 0.574 on N(0, I_d): the acceptance of steps starting
    beyond +2 sd of coordinate 0 is *above* the overall one (so a collapse there is not the
    tail being a tail).  Exact acceptance probabilities, 200,000 starts, fixed generator."""
    g = torch.Generator().manual_seed(5)
    for d, h in ((1, 1.85), (5, 1.3), (13, 1.1)):
        x = torch.randn(200_000, d, generator=g, dtype=F64)
        y = x - 0.5 * h * h * x + h * torch.randn(200_000, d, generator=g, dtype=F64)
        fwd = ((y - x + 0.5 * h * h * x) ** 2).sum(-1)
        bwd = ((x - y + 0.5 * h * h * y) ** 2).sum(-1)
        la = -0.5 * (y ** 2).sum(-1) + 0.5 * (x ** 2).sum(-1) + (fwd - bwd) / (2 * h * h)
        acc = la.clamp(max=0).exp()
        tail = acc[x[:, 0] > 2.0].mean() / acc.mean()
        assert tail > 1.0, (d, float(tail))
        assert tail > 2 * health.TAIL_RATIO


class Funnel:
    """Neal's funnel, ``v ~ N(0, sv^2)``, ``z_i | v ~ N(0, e^v)`` (``i = 1..k``), as a density
    only (the Stan defaults: Gaussian reference, Laplace start, preconditioned MALA); the
    neck is ``v``'s lower tail.  ``centered=False``: the non-centred form ``z_i = e^(v/2) w_i``
    in ``(v, w)``, a standard-scaled Gaussian with the same ``v`` marginal."""

    def __init__(self, centered=True, k=4, sv=1.0):
        self.dim, self.k, self.sv, self.centered = k + 1, k, sv, centered
        self.name = "funnel" if centered else "funnel-noncentered"

    def energy(self, x):
        v, z = x[..., 0], x[..., 1:]
        e = 0.5 * (v / self.sv) ** 2 + 0.5 * (z ** 2).sum(-1) * (
            torch.exp(-v) if self.centered else 1.0)
        return e + (0.5 * self.k * v if self.centered else 0.0)

    def initial_states(self, n, generator, dtype=F64):
        return torch.randn(n, self.dim, generator=generator, dtype=dtype)


def _tail_findings(target, seed):
    opts = dict(rounds=10, chains=6, systems=2, explorer="mala", precondition="auto",
                reference="gaussian", figures=False, seed=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run_config(RunConfig(target=target.name, **opts), target=target)
    return [str(w.message) for w in caught if "explorer acceptance falls" in str(w.message)], res


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
def test_funnel_neck_is_reported_and_its_non_centred_form_is_not(seed):
    """On the funnel (sv = 1, k = 4; rounds 10, 2 systems) MALA's acceptance where ``v`` is
    below its mean - 2 sd is ~0.01 against ~0.47 overall: the finding names coordinate 0's
    lower tail.  (Seed 1 of the same run never reaches that tail at all, so nothing is
    measured there and nothing fires: the finding needs the chain at the neck's mouth.)
    Negative control: the non-centred funnel (same ``v`` marginal, a Gaussian), same seed and
    settings: no finding.  (~10 s per seed on a quiet core: ``make test-slow``.)"""
    msgs, res = _tail_findings(Funnel(), seed)
    assert len(msgs) == 1 and "coordinate 0 is below its mean - 2 sd" in msgs[0], msgs
    msgs, res = _tail_findings(Funnel(centered=False), seed)
    assert msgs == []
    sd_v = float(res.summary["slot0"]["sd"][0])  # the control samples v right (exact sd 1)
    ess = float(res.summary["slot0"]["ess_bulk"][0])
    assert abs(sd_v - 1.0) < 4.0 / math.sqrt(2 * ess)


def test_fused_and_plain_loops_record_the_same_tail_statistics(monkeypatch):
    """The recorder's block form (the fused loop's chunks) and its per-iteration form give the
    same statistics on one run (funnel, rounds 7, ``fuse = true`` against ``false``).
    Negative control: another seed differs."""
    seen = []
    orig = health.check_tails

    def spy(stats, *args):
        seen.append(stats)
        return orig(stats, *args)

    monkeypatch.setattr(health, "check_tails", spy)
    # (the temperature ladder: the Gaussian reference's engine is never fused)
    opts = dict(rounds=7, chains=4, systems=2, explorer="mala", figures=False)
    fused = []
    for fuse, seed in ((True, 1), (False, 1), (True, 2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = run_config(RunConfig(target="funnel", seed=seed, fuse=fuse, **opts),
                             target=Funnel())
        fused.append(res.summary.get("fused"))
    assert fused[0] and fused[0]["chunks"] > 0 and not fused[1]
    a, b, c = seen
    assert a["n"] == b["n"] > 0
    for k in ("acceptance_hi", "acceptance_lo", "n_hi", "entries_lo"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, equal_nan=True)
    assert not np.allclose(a["n_lo"], c["n_lo"]) or a["acceptance"] != c["acceptance"]


def test_plain_loop_rows_are_buffered_copies_taken_64_at_a_time():
    """The per-iteration form buffers rows in :class:`nrpt.recorders.pending.PendingRows` and
    takes them 64 iterations at a time: the same statistics as taking every iteration at once
    (``PENDING = 1``) and as one block per segment, with rows still waiting before a read;
    the caller's acceptance tensor is reused after each record (so the rows must be copies).
    Negative control: a recorder that buffers the caller's tensor itself reads it as it is
    when the rows are taken, and its statistics differ."""
    from types import SimpleNamespace

    from nrpt.recorders.pending import PendingRows

    x, a = _rows(U=300)

    class Every(TailAcceptance):
        PENDING = 1

    class NoCopy(TailAcceptance):
        def record(self, it):
            if self._pending.add(it.slot_x([0])[None, :, 0], it.explore_accept[None, :, 0]):
                self._flush()

    def run(rec):
        accept = torch.zeros(2, 4, dtype=F64)  # the caller's [R, P] tensor, reused
        for u in range(300):
            if u == 150:
                rec.start_segment(True)  # the first 150 set the tails' thresholds
            accept[:, 0] = a[u]
            rec.record(SimpleNamespace(slot_x=lambda slots, u=u: x[u][:, None, :].clone(),
                                       explore_accept=accept))
            accept.fill_(-1.0)
        return rec

    buf, one, bad = run(TailAcceptance(2, 3)), run(Every(2, 3)), run(NoCopy(2, 3))
    assert isinstance(buf._pending, PendingRows) and len(buf._pending) == 150 % 64
    ref = TailAcceptance(2, 3)
    _feed(ref, x[:150], a[:150], [150])
    ref.start_segment(True)
    _feed(ref, x[150:], a[150:], [150])
    s = [r.stats() for r in (buf, one, ref, bad)]
    assert s[0]["n"] == 2 * 150 and len(buf._pending) == 0  # (2 systems; stats took the rows)
    for k in ("acceptance", "acceptance_hi", "acceptance_lo", "n_hi", "entries_hi"):
        for other in s[1:3]:
            np.testing.assert_allclose(s[0][k], other[k], rtol=1e-12, equal_nan=True)
    # (the control's rows all read the caller's tensor as it was at the take)
    assert abs(s[3]["acceptance"] - s[0]["acceptance"]) > 0.01


def test_pending_rows_concatenate_streams_and_count_iterations():
    """:class:`PendingRows`: streams concatenated along the iteration axis in the order
    added, ``add`` says when ``every`` iterations wait (blocks count their rows), a single
    addition comes back as given, ``clear`` drops rows, and ``every`` is validated by name."""
    from nrpt.recorders.pending import PendingRows

    p = PendingRows(every=5)
    assert p.take() is None
    assert not p.add(torch.zeros(1, 2), torch.zeros(1), n=1)
    assert not p.add(torch.ones(3, 2), torch.ones(3), n=3)
    assert p.add(torch.full((1, 2), 2.0), torch.full((1,), 2.0))
    xs, ys = p.take()
    assert xs.tolist() == [[0, 0], [1, 1], [1, 1], [1, 1], [2, 2]] and ys.shape == (5,)
    assert len(p) == 0 and p.take() is None
    one = torch.arange(4.0)[None]
    p.add(one)
    assert p.take()[0] is one
    p.add(one)
    p.clear()
    assert p.take() is None and len(p) == 0
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        PendingRows(every=0)
