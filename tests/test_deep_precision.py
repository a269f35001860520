"""``precision="bf16"`` and ``memory_format="channels_last"`` change rounding only: on a tiny
CNN channels_last gives float32's losses, gradients and BatchNorm statistics to float
tolerance (not bitwise), and a short bf16 run's BMA NLL and accuracy agree with float32's in
law, within a bound derived from the seed-to-seed spread; each check has a negative control
showing it can fail.  Combinations that cannot work are refused with errors naming them."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

from nrpt.deep import DeepConfig, fit
from nrpt.deep.replicas import FunctionalNet

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(autouse=True)
def _no_tf32():
    """Convolutions in full float32 on CUDA (cuDNN's default TF32 rounds to 10 bits)."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def _cnn(seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))


def _images(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, 8, 8, generator=g)
    y = (X.mean((1, 2, 3)) * 8 + torch.randn(n, generator=g)).gt(0).long() + \
        (X[:, 0, :4].mean((1, 2)) > 0.3).long()
    return X, y


def _replicas(net, P=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    theta, buf = net.pack()
    theta = theta[None].repeat(P, 1) + 0.1 * torch.randn(P, net.dim, generator=g)
    return theta, buf[None].repeat(P, 1)


def _close(a, b, tol=1e-5):
    """Relative error of ``a`` to ``b`` (float32 rounding of a few dozen products: ~1e-7)."""
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_gives_float32_losses_gradients_and_statistics(device):
    X, y = (t.to(device) for t in _images())
    P, B = 3, 10
    x, yb = X[:P * B].reshape(P, B, 1, 8, 8), y[:P * B].reshape(P, B)
    ref, cl = FunctionalNet(_cnn().to(device)), FunctionalNet(_cnn().to(device))
    cl.set_execution(memory_format="channels_last", example=X[:2])
    theta, buf = (t.to(device) for t in _replicas(ref))
    seen = {}
    for name, n in (("ref", ref), ("cl", cl)):
        n.module[3].register_forward_pre_hook(lambda m, a, name=name: [seen.setdefault(
            name, m.weight.is_contiguous(memory_format=torch.channels_last)), None][1])
    L0, G0, B0 = ref.loss_and_grad(theta, buf, x, yb, "loop")
    L1, G1, B1 = cl.loss_and_grad(theta, buf, x, yb, "loop")
    # the format is applied (the convolutions see NHWC weights), not ignored
    assert seen == {"ref": False, "cl": True}
    assert _close(L1, L0) and _close(G1, G0) and _close(B1, B0)
    assert _close(cl.logits(theta, buf, X, "loop"), ref.logits(theta, buf, X, "loop"))
    # negative control: the same tolerance tells a 1e-3 change of one weight apart
    other = theta.clone()
    other[:, 0] += 1e-3
    _, G2, _ = cl.loss_and_grad(other, buf, x, yb, "loop")
    assert not _close(G2, G0)


def test_a_channels_last_run_equals_a_contiguous_one_to_rounding():
    X, y = _images(120)
    train, test = (X[:80], y[:80]), (X[80:], y[80:])
    opts = dict(method="deo", chains=2, epochs=2, seed=3, batch_size=20, swap_rate=0.3,
                pretrain_epochs=1, eval_every=2)
    a = fit(_cnn(), train, test, strategy="loop", **opts)
    b = fit(_cnn(), train, test, memory_format="channels_last", **opts)
    assert b.summary["strategy"] == "loop"  # (auto picks loop for channels_last)
    pa, pb = a.predict_proba(test[0]), b.predict_proba(test[0])
    assert float((pa - pb).abs().max()) < 1e-4
    assert b.summary["nll_sum"] == pytest.approx(a.summary["nll_sum"], rel=1e-4)


# ------------------------------------------------------------------ bf16, in law
def _mlp(seed):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))


def _tabular():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(700, 6, generator=g)
    y = (X @ torch.randn(6, 3, generator=g) + 0.8 * torch.randn(700, 3, generator=g)).argmax(1)
    return (X[:300], y[:300]), (X[300:], y[300:])


LAW = dict(method="ensemble", chains=3, epochs=4, batch_size=30, strategy="vmap",
           pretrain_epochs=2, eval_every=4)
SEEDS = range(5)


def _runs(**kw):
    train, test = _tabular()
    return [fit(_mlp(s), train, test, seed=s, **{**LAW, **kw}).summary for s in SEEDS]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_bf16_channels_last_run_streams_its_models_and_agrees(tmp_path):
    """On a GPU (run where one is lent): bf16 + channels_last end to end, models streamed to
    the folder from the device, predict_proba equal to the run's own average; bf16 in law."""
    X, y = _images(120)
    train, test = (X[:80], y[:80]), (X[80:], y[80:])
    opts = dict(method="deo", chains=2, epochs=2, seed=3, batch_size=20, swap_rate=0.3,
                pretrain_epochs=1, eval_every=2, device="cuda")
    res = fit(_cnn(), train, test, out=tmp_path / "run", precision="bf16",
              memory_format="channels_last", **opts)
    p = res.predict_proba(test[0])
    assert p.device.type == "cuda" and len(res.store) == res.summary["models_collected"] > 0
    from nrpt.deep.metrics import evaluate
    assert evaluate(p, test[1].cuda())["nll_sum"] == pytest.approx(res.summary["nll_sum"],
                                                                   rel=1e-9)
    f32, bf16 = _runs(device="cuda"), _runs(device="cuda", precision="bf16")
    assert _agree(f32, bf16, "nll_mean") and _agree(f32, bf16, "accuracy")


def _agree(a, b, key):
    """|mean_a - mean_b| within 3 standard errors of a difference of two means of n runs,
    each with the seed-to-seed spread of the float32 runs: ``3 sd sqrt(2 / n)``."""
    xa, xb = [r[key] for r in a], [r[key] for r in b]
    bound = 3 * statistics.stdev(xa) * math.sqrt(2 / len(xa))
    return abs(statistics.mean(xb) - statistics.mean(xa)) < bound


def test_a_bf16_run_agrees_in_law_with_float32():
    f32, bf16 = _runs(), _runs(precision="bf16")
    assert [r["nll_mean"] for r in f32] != [r["nll_mean"] for r in bf16]  # bf16 really ran
    assert _agree(f32, bf16, "nll_mean") and _agree(f32, bf16, "accuracy")
    # negative control: a run of a quarter of the epochs is another law, and the bound says so
    assert not _agree(f32, _runs(epochs=1.0), "nll_mean")


# ------------------------------------------------------------------ refused combinations
def test_combinations_that_cannot_work_are_refused():
    X, y = _images(40)
    with pytest.raises(ValueError, match=r"precision must be one of .*float32.*bf16"):
        DeepConfig(precision="fp16")
    with pytest.raises(ValueError, match=r"memory_format must be one of"):
        DeepConfig(memory_format="nhwc")
    with pytest.raises(ValueError, match="channels_last' runs the loop strategy.*'vmap'"):
        DeepConfig(memory_format="channels_last", strategy="vmap")
    (tr, te) = _tabular()
    with pytest.raises(ValueError, match=r"applies to image inputs .*\[2, 6\]"):
        fit(_mlp(0), tr, te, memory_format="channels_last", epochs=1)
    with pytest.raises(ValueError, match="autocasts float32 models.*float64"):
        fit(_mlp(0).double(), (tr[0].double(), tr[1]), (te[0].double(), te[1]),
            precision="bf16", epochs=1)
