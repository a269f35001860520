"""Network replicas (nrpt.deep): stacked evaluation equals the per-replica loop and PyTorch's own
training step, swaps move slots and never weights, fit runs every method through the one loop,
resumes bit for bit, and refuses bad input by name."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from nrpt import rng
from nrpt.core.engine import PTEngine
from nrpt.deep.energy import NetworkEnergy, NetworkTarget
from nrpt.deep.fitting import DeepConfig, fit
from nrpt.deep.metrics import evaluate
from nrpt.deep.replicas import FunctionalNet, StrategyWarning, choose_strategy
from nrpt.explorers.sgmcmc import MomentumSGD
from nrpt.paths.ladders import NoiseLadder
from nrpt.swap import DEOW, Deterministic, NoSwap


def _bn_mlp(d=6, h=8, c=3, dtype=torch.float64, seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(d, h), nn.BatchNorm1d(h), nn.ReLU(),
                             nn.Linear(h, c)).to(dtype)


def _bn_cnn(dtype=torch.float64):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU(),
                             nn.Flatten(), nn.Linear(4 * 10, 3)).to(dtype)


def _toy(n=120, d=6, c=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=dtype)
    W = torch.randn(d, c, generator=g, dtype=dtype)
    y = (X @ W + 0.3 * torch.randn(n, c, generator=g, dtype=dtype)).argmax(1)
    return X, y


# ------------------------------------------------------------------ stacked == loop
@pytest.mark.parametrize("make,shape", [(_bn_mlp, (6,)), (_bn_cnn, (1, 10))])
def test_vmap_equals_loop_forward_loss_grad_buffers(make, shape):
    net = FunctionalNet(make())
    theta0, buf0 = net.pack()
    g = torch.Generator().manual_seed(3)
    P, B = 3, 16
    theta = theta0 + 0.1 * torch.randn(P, net.dim, generator=g, dtype=torch.float64)
    buf = buf0 + 0.05 * torch.rand(P, net.buffer_dim, generator=g, dtype=torch.float64)
    x = torch.randn(P, B, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(3, (P, B), generator=g)
    l1, g1, b1 = net.loss_and_grad(theta, buf, x, y, "loop")
    l2, g2, b2 = net.loss_and_grad(theta, buf, x, y, "vmap")
    assert torch.allclose(l1, l2, rtol=0, atol=1e-10)
    assert torch.allclose(g1, g2, rtol=0, atol=1e-10)
    assert torch.allclose(b1, b2, rtol=0, atol=1e-12)
    assert (b1 - buf).abs().max() > 1e-3  # the statistics did move (vmap must not drop them)
    # and both equal a plain module's training forward/backward
    for i in range(P):
        m = net.load(theta[i], buf[i]).train()
        loss = nn.functional.cross_entropy(m(x[i]), y[i], reduction="sum")
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        assert torch.allclose(grad, g1[i], rtol=0, atol=1e-10)
        assert torch.allclose(net.pack(m)[1], b1[i], rtol=0, atol=1e-12)
    # eval-mode logits of the stack equal each module's
    lg_loop = net.logits(theta, buf, x[0], "loop")
    lg_vmap = net.logits(theta, buf, x[0], "vmap")
    assert torch.allclose(lg_loop, lg_vmap, rtol=0, atol=1e-10)
    for i in range(P):
        ref = net.load(theta[i], buf[i]).eval()(x[0])
        assert torch.allclose(lg_loop[i], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_two_momentum_sgd_steps_equal_torch_optim(strategy):
    """Full-batch energy (batch = N: a permutation, so deterministic) and the engine's mSGD at
    learning rate lr / N equal torch.optim.SGD(lr, momentum, weight_decay) on each replica."""
    X, y = _toy(n=40)
    lr, mom, wd, P = 0.1, 0.9, 5e-3, 2
    net = FunctionalNet(_bn_mlp())
    theta0, buf0 = net.pack()
    g = torch.Generator().manual_seed(5)
    start = theta0 + 0.2 * torch.randn(P, net.dim, generator=g, dtype=torch.float64)
    target = NetworkTarget(net, X, y, weight_decay=wd, strategy=strategy)
    est = NetworkEnergy(target, batch_size=40)
    eng = PTEngine(target, NoiseLadder([0.0] * P), MomentumSGD(est, momentum=mom), NoSwap(),
                   Deterministic(0.0), step_size=lr / 40, seed=0, initial_states=start[None])
    eng.step()
    eng.step()
    for r in range(P):
        m = net.load(start[r], buf0).train()
        opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=mom, weight_decay=wd)
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(m(X), y).backward()
            opt.step()
        with torch.no_grad():
            m(X)  # the engine evaluates the energy (a training forward) at the new state
        theta_ref, buf_ref = net.pack(m)
        assert torch.allclose(eng.state.x[0, r], theta_ref, rtol=0, atol=1e-10)
        # BatchNorm saw the same three training forwards (x0, x1, x2) in both
        assert torch.allclose(eng.state.extras["bn"][0, r], buf_ref, rtol=0, atol=1e-10)


# ------------------------------------------------------------------ swaps move slots only
def test_swaps_exchange_slots_not_weights_and_learning_rates_follow():
    X, y = _toy()
    P = 4
    net = FunctionalNet(_bn_mlp())
    theta0, _ = net.pack()
    g = torch.Generator().manual_seed(2)
    start = (theta0 + 0.2 * torch.randn(P, net.dim, generator=g, dtype=torch.float64))[None]
    steps = [0.01 / 120 * 2 ** p for p in range(P)]

    def engine(rule, scheme):
        target = NetworkTarget(net, X, y, strategy="vmap")
        est = NetworkEnergy(target, batch_size=16)
        return PTEngine(target, NoiseLadder([0.0] * P), MomentumSGD(est), scheme, rule,
                        step_size=steps, seed=4, initial_states=start)

    swapping = engine(Deterministic(-1e12), DEOW(1))  # every proposed pair swaps
    still = engine(Deterministic(0.0), NoSwap())
    swapping.step()
    still.step()
    for key in ("momentum", "bn", "sg_grad"):
        assert torch.equal(swapping.state.extras[key], still.state.extras[key])
    assert torch.equal(swapping.state.x, still.state.x)
    assert not torch.equal(swapping.slot_of, still.slot_of)  # the slots did move
    # next move: each replica at the learning rate of its new slot
    before = swapping.state
    slot = swapping.slot_of[0]
    swapping.step()
    for r in range(P):
        eta = steps[int(slot[r])]
        m = 0.9 * before.extras["momentum"][0, r] - eta * before.extras["sg_grad"][0, r]
        assert torch.allclose(swapping.state.x[0, r], before.x[0, r] + m, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ fit
def _fit(method, **kw):
    X, y = _toy(n=200, dtype=torch.float32)
    model = _bn_mlp(dtype=torch.float32)
    opts = dict(chains=4, epochs=4, seed=0, batch_size=25, lr_min=0.02, lr_max=0.2,
                pretrain_epochs=1, strategy="vmap")
    if method in ("deo-star", "deo"):  # (a setting the method does not read is an error)
        opts["swap_rate"] = 0.3
    opts.update(kw)
    return fit(model, (X[:150], y[:150]), (X[150:], y[150:]), method=method, **opts), X, y


@pytest.mark.parametrize("method", ["deo-star", "deo", "ensemble", "cyclical", "swag"])
def test_fit_every_method_reports_the_summary_and_predicts(method):
    res, X, y = _fit(method)
    s = res.summary
    for key in ("accuracy", "nll_mean", "nll_sum", "ece", "brier", "round_trips", "swap_rates",
                "learning_rates", "correction", "gradient_evaluations"):
        assert key in s, key
    assert s["models_collected"] >= 1
    # equal budget: every method is charged epochs * chains * ceil(N / B) minibatch gradients
    assert s["gradient_evaluations"] == 4 * 4 * math.ceil(150 / 25)
    assert s["accuracy"] > 0.5  # three classes: chance is about 1/3
    probs = res.predict_proba(X[150:])
    assert probs.shape == (50, 3)
    assert torch.allclose(probs.sum(1), torch.ones(50, dtype=probs.dtype), atol=1e-6)
    again = evaluate(probs, y[150:])
    assert again["nll_mean"] == pytest.approx(s["nll_mean"], rel=1e-5)
    if method in ("deo-star", "deo"):
        assert len(s["swap_rates"]) == 3 and s["correction"] is not None
        assert res.index.shape == (s["iterations"], 4)
    else:
        assert s["round_trips"] == 0


def test_fit_deo_star_uses_the_optimal_window_and_deo_uses_one():
    from nrpt.report.health import SamplingWarning

    with pytest.warns(SamplingWarning, match="windows of W = 342"):  # 6 iterations, W* = 342
        a, _, _ = _fit("deo-star", epochs=1, pretrain_epochs=0, swap_rate=0.005)
    b, _, _ = _fit("deo", epochs=1, pretrain_epochs=0, swap_rate=0.005)
    # W* = ceil((log 4 + log log 4) / -log(0.995)) = 342
    assert a.summary["window"] == math.ceil((math.log(4) + math.log(math.log(4)))
                                            / -math.log(1 - 0.005))
    assert b.summary["window"] == 1


def _interrupted_then_resumed(tmp_path, checks, **kw):
    """An uninterrupted run, the same run stopped at its first callback (iteration 256) in
    ``tmp_path / "run"``, ``checks(part, run)`` on the stopped one, and its resumption; the
    resumed summary must equal the uninterrupted one."""
    X, y = _toy(n=200, dtype=torch.float32)
    kw = dict(chains=3, batch_size=25, lr_min=0.02, lr_max=0.2, swap_rate=0.3,
              strategy="vmap", checkpoint_every=100, **kw)
    train, test = (X[:150], y[:150]), (X[150:], y[150:])
    run = lambda **more: fit(_bn_mlp(dtype=torch.float32), train, test,  # noqa: E731
                             **{**kw, **more})
    whole = run()

    def stop(engine):
        raise KeyboardInterrupt

    part = run(out=tmp_path / "run", callback=stop)
    assert part.summary["interrupted"]
    checks(part, run)
    done = run(out=tmp_path / "run", resume=True)
    assert not done.summary["interrupted"]
    for key in ("accuracy", "nll_sum", "ece", "brier", "round_trips", "correction",
                "learning_rates", "swap_rates"):
        assert done.summary[key] == whole.summary[key], key


def test_fit_resumes_bit_for_bit(tmp_path):
    def checks(part, run):
        assert part.summary["iterations"] == 256
        with pytest.raises(ValueError, match="lr_max: 0.2 -> 0.3"):
            run(out=tmp_path / "run", resume=True, lr_max=0.3)

    _interrupted_then_resumed(tmp_path, checks, method="deo-star", epochs=45, seed=1,
                              pretrain_epochs=0, eval_every=15)
    assert (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "index_process.png").exists()


def test_fit_interrupted_in_pretraining_resumes_bit_for_bit(tmp_path):
    def checks(part, run):
        assert part.summary["phase"] == "pretraining"
        assert not (tmp_path / "run" / "pretrained.pt").exists()
        with pytest.raises(FileExistsError, match="already holds a deep run"):
            run(out=tmp_path / "run")

    _interrupted_then_resumed(tmp_path, checks, method="deo", epochs=3, seed=2,
                              pretrain_epochs=45, eval_every=3)


# ------------------------------------------------------------------ bad input
def test_bad_input_is_refused_by_name():
    X, y = _toy(n=60, dtype=torch.float32)
    model = _bn_mlp(dtype=torch.float32)
    with pytest.raises(ValueError, match="chains"):
        fit(model, (X, y), (X, y), chains=1)
    with pytest.raises(ValueError, match="method"):
        fit(model, (X, y), (X, y), method="sgld")
    with pytest.raises(ValueError, match="do not fit the model"):
        fit(model, (X[:, :4], y), (X[:, :4], y))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        fit(model, (X, y + 5), (X, y))
    with pytest.raises(ValueError, match="X has 60 rows"):
        fit(model, (X, y[:10]), (X, y))
    bad = X.clone()
    bad[7, 2] = float("nan")  # (the training X is checked once, before its labels' range)
    with pytest.raises(ValueError, match="train: X holds NaN or inf"):
        fit(model, (bad, y), (X, y))
    with pytest.raises(ValueError, match="test: X holds NaN or inf"):
        fit(model, (X, y), (bad, y))
    with pytest.raises(ValueError, match="batch_size"):
        fit(model, (X, y), (X, y), batch_size=500)
    with pytest.raises(ValueError, match="average"):
        DeepConfig(average="median")
    split = _bn_mlp(dtype=torch.float32)
    split[0].weight = nn.Parameter(torch.empty(8, 6, device="meta"))
    with pytest.raises(ValueError, match="different devices"):
        fit(split, (X, y), (X, y))


def test_a_model_that_cannot_be_vmapped_falls_back_to_the_loop_with_a_warning():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3).double()

        def forward(self, x):
            if x.sum().item() > 0:  # data-dependent control flow
                return self.lin(x)
            return -self.lin(x)

    with pytest.warns(StrategyWarning, match="using 'loop'"):
        assert _choose(FunctionalNet(Branchy()), "vmap") == "loop"


def _choose(net: FunctionalNet, strategy: str) -> str:
    """The strategy ``choose_strategy`` settles on for two replicas of ``net`` on toy data."""
    theta, buf = net.pack()
    X, y = _toy(n=8)
    chosen, _ = choose_strategy(net, theta.expand(2, -1), buf.expand(2, -1), X.expand(2, 8, 6),
                                y.expand(2, 8), strategy)
    return chosen


def test_dropout_is_keyed_and_leaves_the_global_rng_alone():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3)).double()
    net = FunctionalNet(m)
    theta, buf = net.pack()
    X, y = _toy(n=8)
    args = (theta.expand(2, -1), buf.expand(2, -1), X.expand(2, 8, 6), y.expand(2, 8), "vmap")
    state = torch.get_rng_state()
    a = net.loss_and_grad(*args, seed=rng.key(1, 2))[0]
    b = net.loss_and_grad(*args, seed=rng.key(1, 2))[0]
    c = net.loss_and_grad(*args, seed=rng.key(1, 3))[0]
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])  # randomness="different": each replica its own mask


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside torch's compiler
def test_compiled_strategy_equals_the_loop():
    """torch.compile of the vmapped step (about 15 s to compile on 2 cores: slow suite)."""
    net = FunctionalNet(_bn_mlp())
    theta0, buf0 = net.pack()
    g = torch.Generator().manual_seed(3)
    theta = theta0 + 0.1 * torch.randn(3, net.dim, generator=g, dtype=torch.float64)
    buf = buf0.expand(3, -1).clone()
    x = torch.randn(3, 16, 6, generator=g, dtype=torch.float64)
    y = torch.randint(3, (3, 16), generator=g)
    for a, b in zip(net.loss_and_grad(theta, buf, x, y, "loop"),
                    net.loss_and_grad(theta, buf, x, y, "compile"), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_a_failing_compile_falls_back_to_vmap(monkeypatch):
    def broken(fn, **kw):
        def call(*a, **k):
            raise RuntimeError("no compiler here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(StrategyWarning, match="using 'vmap'"):
        assert _choose(FunctionalNet(_bn_mlp()), "compile") == "vmap"


def test_cli_deep_runs_writes_the_folder_and_resumes(tmp_path, capsys):
    from nrpt.run.cli import main

    out = tmp_path / "deep"
    args = ["deep", "--dataset", "digits", "--method", "deo-star", "--chains", "2", "--epochs",
            "2", "--seed", "0", "--out", str(out), "--no-progress", "--pretrain-epochs", "0.5",
            "--batch-size", "64", "--strategy", "vmap", "--swap-rate", "0.2"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "round_trips" in text
    for name in ("cli.json", "config.json", "summary.json", "metrics.csv", "index.npy",
                 "models/index.json", "reliability.png", "slot_accuracy.png", "index_process.png"):
        assert (out / name).exists(), name
    assert main(args) == 2  # the folder holds a run
    assert "already holds a run" in capsys.readouterr().err
    first = json.loads((out / "summary.json").read_text())
    assert main(["deep", "--resume", str(out), "--no-progress"]) == 0  # finished: same result
    again = json.loads((out / "summary.json").read_text())
    # the resumption adds its time to the run's (it used to replace it with its own)
    assert again["wall_time_s"] >= first["wall_time_s"] >= first["loop_time_s"] > 0
    assert again["wall_time_s"] >= again["loop_time_s"]


def test_every_nrpt_deep_option_has_help():
    import argparse

    from nrpt.run.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    deep = sub.choices["deep"]
    assert [a.option_strings for a in deep._actions if a.option_strings and not a.help] == []


def test_cli_deep_cifar_without_files_says_what_to_put_where(tmp_path, capsys):
    from nrpt.run.cli import main

    code = main(["deep", "--dataset", "cifar100", "--data-dir", str(tmp_path), "--epochs", "1",
                 "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cifar-100-python" in err


def test_cifar_pipeline_runs_end_to_end_on_a_tiny_fake_folder(tmp_path, capsys):
    """ResNet-20, the paper's augmentation and the CLI on 40 fake CIFAR-10 images (a smoke test
    of the pipeline the GPU command uses; the numbers mean nothing)."""
    import numpy as np
    from test_deep_data import _write_batch

    from nrpt.run.cli import main

    gen = np.random.default_rng(0)
    base = tmp_path / "data" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for i in range(1, 6):
        _write_batch(base / f"data_batch_{i}", 8, b"labels", 10, gen)
    _write_batch(base / "test_batch", 6, b"labels", 10, gen)
    code = main(["deep", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data"),
                 "--model", "resnet20", "--method", "deo-star", "--chains", "2", "--epochs",
                 "2", "--batch-size", "8", "--pretrain-epochs", "0", "--strategy", "loop",
                 "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0
    assert (tmp_path / "run" / "summary.json").exists()
    assert "accuracy" in capsys.readouterr().out


def test_minibatch_network_energy_is_unbiased_and_its_variance_estimate_matches():
    """Ũ_B over many keyed batches: mean = the full-data energy U within Monte Carlo error, and
    the plug-in variance = the empirical variance; negative control: a 3 % scale error is
    detected by the same test."""
    X, y = _toy(n=300)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 3)).double()  # no BatchNorm: U is exact
    net = FunctionalNet(model)
    target = NetworkTarget(net, X, y, weight_decay=1e-2, strategy="vmap")
    est = NetworkEnergy(target, batch_size=30)
    theta, _ = net.pack()
    x = theta.expand(1, 1, -1)
    U = float(target.energy(theta[None])[0])
    draws = [est(x, rng.Key((7, k, 0, 1)), {"bn": torch.zeros(1, 1, 0, dtype=torch.float64)})
             for k in range(600)]
    u = torch.tensor([float(d.u) for d in draws], dtype=torch.float64)
    var_est = torch.tensor([float(d.var) for d in draws], dtype=torch.float64).mean()
    se = float(u.std()) / math.sqrt(len(u))
    assert abs(float(u.mean()) - U) < 4 * se
    # sample variance of 600 draws: relative se about sqrt(2 / 599) = 6 %; allow 25 %
    assert float(u.var()) == pytest.approx(float(var_est), rel=0.25)
    assert abs(0.97 * float(u.mean()) - U) > 4 * se  # negative control


def test_refreshed_buffers_average_the_batch_statistics():
    """SWAG's BatchNorm update: running mean/var = the mean over batches of each batch's mean and
    unbiased variance of the layer's input (checked on the first layer, whose input is known)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.BatchNorm1d(6), nn.Linear(6, 3)).double()
    net = FunctionalNet(model)
    theta, buf = net.pack()
    X, _ = _toy(n=40)
    batches = list(X.split(16))  # 16, 16, 8
    new = net.refreshed_buffers(theta, buf, batches)
    mean = torch.stack([b.mean(0) for b in batches]).mean(0)
    var = torch.stack([b.var(0) for b in batches]).mean(0)
    assert torch.allclose(new, torch.cat([mean, var]), rtol=0, atol=1e-12)
    assert torch.equal(net.refreshed_buffers(theta, buf, []), buf)  # no batches: unchanged
