"""BMA evaluation (nrpt.deep.metrics): hand-computed numbers on a toy, calibration checks whose
tolerance comes from the binomial error (with a negative control), and the input errors."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import Tensor

from nrpt.deep.metrics import BMA, PROB_FLOOR, evaluate, reliability

F64 = torch.float64

# Two fixed "models" on a 4-example, 3-class toy.  With 15 bins the edges are k/15
# (…, .5333, .6, .6667, .7333, .8, .8667, .9333, 1); no confidence below sits on an edge.
Y = torch.tensor([0, 1, 1, 2])
A = torch.tensor([[0.70, 0.20, 0.10],      # conf .70 (bin 10), correct
                  [0.72, 0.18, 0.10],      # conf .72 (bin 10), wrong (label 1)
                  [0.25, 0.55, 0.20],      # conf .55 (bin 8), correct
                  [0.05, 0.05, 0.90]],     # conf .90 (bin 13), correct
                 dtype=F64)
B = torch.tensor([[0.50, 0.30, 0.20],
                  [0.20, 0.70, 0.10],
                  [0.45, 0.35, 0.20],
                  [0.30, 0.10, 0.60]], dtype=F64)


def test_hand_computed_numbers_of_one_model():
    m = evaluate(A, Y)
    assert m["accuracy"] == 0.75
    nll = -(math.log(0.70) + math.log(0.18) + math.log(0.55) + math.log(0.90))
    assert m["nll_sum"] == pytest.approx(nll, abs=1e-12)
    assert m["nll_mean"] == pytest.approx(nll / 4, abs=1e-12)
    # Brier rows: .09+.04+.01, .5184+.6724+.01, .0625+.2025+.04, .0025+.0025+.01
    assert m["brier"] == pytest.approx((0.14 + 1.2008 + 0.305 + 0.015) / 4, abs=1e-12)
    # ECE: bin 10 holds two (acc .5, conf .71), bin 8 one (1 vs .55), bin 13 one (1 vs .90)
    assert m["ece"] == pytest.approx(2 / 4 * 0.21 + 1 / 4 * 0.45 + 1 / 4 * 0.10, abs=1e-12)
    assert all(isinstance(v, float) for v in m.values())


def test_reliability_bins_of_the_toy():
    r = reliability(A, Y)
    assert len(r["edges"]) == 16 and r["edges"][0] == 0.0 and r["edges"][-1] == 1.0
    assert r["edges"][9] == 0.6                  # k/15 rounded once: the decimal edge exactly
    assert r["count"] == [0] * 8 + [1, 0, 2, 0, 0, 1, 0]
    assert r["confidence"][10] == pytest.approx(0.71) and r["accuracy"][10] == 0.5
    assert r["confidence"][8] == pytest.approx(0.55) and r["accuracy"][8] == 1.0
    assert r["confidence"][0] is None and r["accuracy"][0] is None     # empty bin: None
    # a confidence exactly on an edge closes its bin: (8/15, 9/15] holds 0.6
    edge = reliability(torch.tensor([[0.6, 0.4]], dtype=F64), torch.tensor([0]))
    assert edge["count"][8] == 1


def test_bma_probability_and_logit_averaging_by_hand():
    bma = BMA()
    bma.add(A.log())
    bma.add(B.log())
    assert bma.count == 2
    mean_p = bma.probs()
    assert torch.allclose(mean_p, (A + B) / 2, atol=1e-15, rtol=0)
    # logit averaging = normalised geometric mean: row 0 is sqrt(.35), sqrt(.06), sqrt(.02) / sum
    g = torch.tensor([math.sqrt(0.7 * 0.5), math.sqrt(0.2 * 0.3), math.sqrt(0.1 * 0.2)], dtype=F64)
    geo = bma.probs(average="logits")
    assert torch.allclose(geo[0], g / g.sum(), atol=1e-15, rtol=0)
    assert torch.allclose(geo, (A * B).sqrt() / (A * B).sqrt().sum(1, keepdim=True), atol=1e-15)
    # the two averages differ: example 0 has .6 by probabilities, .5916/.9780 = .6049 by logits
    assert mean_p[0, 0] == pytest.approx(0.6, abs=1e-15)
    assert geo[0, 0].item() == pytest.approx(0.6049, abs=1e-4)
    # and the metrics of the average are those of the averaged table: acc 3/4 (ex. 1: .46 vs .44)
    m = evaluate(mean_p, Y)
    assert m["accuracy"] == 0.75
    assert m["nll_sum"] == pytest.approx(-math.log(0.6 * 0.44 * 0.45 * 0.75), abs=1e-12)


def test_bma_state_dict_roundtrip_weights_only():
    bma = BMA()
    blank = io.BytesIO()
    torch.save(BMA().state_dict(), blank)
    blank.seek(0)
    fresh = BMA()
    fresh.load_state_dict(torch.load(blank, weights_only=True))
    assert fresh.count == 0
    bma.add(A.log())
    buf = io.BytesIO()
    torch.save(bma.state_dict(), buf)
    buf.seek(0)
    other = BMA()
    other.load_state_dict(torch.load(buf, weights_only=True))
    other.add(B.log())
    bma.add(B.log())
    assert other.count == 2
    assert torch.equal(other.probs(), bma.probs())
    assert torch.equal(other.probs("logits"), bma.probs("logits"))


def test_bma_errors():
    bma = BMA()
    with pytest.raises(RuntimeError, match="before any add"):
        bma.probs()
    with pytest.raises(ValueError, match="average must be one of probabilities, logits"):
        bma.probs(average="geometric")
    with pytest.raises(ValueError, match="logits must be a 2-D tensor"):
        bma.add(torch.zeros(3))
    bma.add(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"logits must have the shape .*\(4, 3\)"):
        bma.add(torch.zeros(5, 3))
    with pytest.raises(ValueError, match="logits must be finite"):
        bma.add(torch.full((4, 3), float("nan")))


def test_constant_overconfident_predictor_has_ece_0_4():
    """Every example p = .9 on class 0, half the labels 0: accuracy .5, one bin, ECE = .4."""
    n = 1000
    probs = torch.tensor([0.9, 0.1], dtype=F64).expand(n, 2)
    y = torch.arange(n) % 2
    m = evaluate(probs, y)
    assert m["accuracy"] == 0.5
    assert m["ece"] == pytest.approx(0.4, abs=1e-12)
    assert m["nll_mean"] == pytest.approx(-(math.log(0.9) + math.log(0.1)) / 2, abs=1e-12)
    assert m["brier"] == pytest.approx((0.01 + 0.01 + 0.81 + 0.81) / 2, abs=1e-12)


def _calibrated(n: int, gen: torch.Generator):
    """Binary predictor: confidence c ~ U(.5, .95) on class 0, correct with probability c."""
    c = 0.5 + 0.45 * torch.rand(n, generator=gen, dtype=F64)
    correct = torch.rand(n, generator=gen, dtype=F64) < c
    y = torch.where(correct, 0, 1)
    return c, y


def _ece_bound(conf: Tensor, c: Tensor, bins: int = 15, k: float = 5.0) -> float:
    """k-sigma bound on |ECE - offset| from the binomial error of each bin's accuracy.

    Examples are binned by their reported confidence ``conf``; given it, bin b's accuracy is a
    mean of independent Bernoulli(c_i), so acc_b - E[acc_b] has sd
    σ_b = sqrt(Σ_b c_i(1-c_i)) / n_b; ECE moves by at most
    Σ_b (n_b/n) |acc_b - E[acc_b]| ≤ Σ_b (n_b/n) k σ_b with every bin within k = 5 sd (a
    union over 15 bins: failure probability < 15 · 6e-7)."""
    idx = torch.clamp(torch.ceil(conf * bins).long() - 1, 0, bins - 1)
    var = torch.zeros(bins, dtype=F64).index_add_(0, idx, c * (1 - c))
    return float(k * var.sqrt().sum() / c.numel())       # Σ (n_b/n) k sqrt(var_b)/n_b


def test_ece_of_a_calibrated_predictor_is_zero_within_binomial_error():
    gen = torch.Generator().manual_seed(7)
    n = 1_000_000
    c, y = _calibrated(n, gen)
    probs = torch.stack([c, 1 - c], dim=1)
    bound = _ece_bound(c, c)
    assert bound < 0.01
    ece = evaluate(probs, y)["ece"]
    assert ece < bound, (ece, bound)
    # negative control: the same outcomes reported .05 more confident.  Within every bin
    # E[acc_b] = conf_b - .05, so ECE = .05 up to the same binomial error: clearly not 0.
    inflated = torch.stack([c + 0.05, 0.95 - c], dim=1)
    ece_bad = evaluate(inflated, y)["ece"]
    assert abs(ece_bad - 0.05) < _ece_bound(c + 0.05, c), ece_bad
    assert ece_bad > 3 * bound


@pytest.mark.parametrize("probs, y, msg", [
    (torch.ones(3) / 3, torch.tensor([0]), "probs must be a 2-D tensor"),
    (torch.ones(2, 3) / 3, torch.tensor([0, 1, 2]), "y must be a 1-D tensor of 2 labels"),
    (torch.ones(2, 3) / 3, torch.tensor([[0, 1]]), "y must be a 1-D tensor of 2 labels"),
    (torch.ones(2, 3) / 3, torch.tensor([0, 3]), r"labels in \[0, 3\)"),
    (torch.ones(2, 3) / 3, torch.tensor([-1, 0]), r"labels in \[0, 3\)"),
    (torch.ones(2, 3) / 3, torch.tensor([0.0, 1.0]), "integer class labels"),
    (torch.tensor([[float("nan"), 0.5], [0.5, 0.5]]), torch.tensor([0, 1]), "probs must be finite"),
    (torch.tensor([[float("inf"), 0.5], [0.5, 0.5]]), torch.tensor([0, 1]), "probs must be finite"),
])
def test_bad_inputs_name_the_argument(probs, y, msg):
    with pytest.raises(ValueError, match=msg):
        evaluate(probs, y)
    with pytest.raises(ValueError, match=msg):
        reliability(probs, y)


def test_bins_must_be_positive_and_zero_probability_is_clamped():
    with pytest.raises(ValueError, match="bins must be a positive integer"):
        evaluate(A, Y, bins=0)
    m = evaluate(torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([1]))
    assert m["nll_sum"] == pytest.approx(-math.log(PROB_FLOOR))
    assert m["ece"] == 1.0 and m["brier"] == 2.0


def test_all_finite_matches_torch():
    """The NumPy-view finiteness check answers what ``torch.isfinite(t).all()`` does."""
    from nrpt.deep.metrics import all_finite

    base = torch.arange(12.0).reshape(3, 4)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for bad in (None, float("nan"), float("inf"), -float("inf")):
            t = base.to(dtype)
            if bad is not None:
                t[1, 2] = bad
            for view in (t, t[:, ::2], t.t()):
                assert all_finite(view) == bool(torch.isfinite(view).all())
    assert not all_finite(torch.tensor([1.0, float("nan")], requires_grad=True))
    assert all_finite(torch.ones(3, requires_grad=True))


def test_all_finite_reads_no_numpy_view_in_a_graph_being_compiled(monkeypatch):
    """``all_finite`` takes its NumPy view only where :func:`nrpt.host.viewable` allows: in a
    graph being compiled it answers through torch (negative control: outside one it reads the
    view)."""
    from nrpt.deep import metrics

    reads = []
    real = torch.Tensor.numpy
    monkeypatch.setattr(torch.Tensor, "numpy", lambda t, *a, **k: reads.append(1) or real(t))
    t = torch.tensor([1.0, float("inf")])
    assert not metrics.all_finite(t) and reads == [1]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not metrics.all_finite(t) and metrics.all_finite(torch.ones(2)) and reads == [1]
