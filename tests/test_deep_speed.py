"""The fast paths of nrpt.deep (issue 24) equal the plain ones: BatchNorm's own running-statistics
update equals a plain module's, a step that draws no noise for cold slots equals one that draws
it and multiplies it by 0, engines that start from a minibatch energy run as those that started
from the full-data one, the forward-only energy equals the one with gradients; the strategy
choice is stable near ties; a run stopped by its time budget writes its outputs and resumes
bit for bit; the synthetic CIFAR-shaped dataset is fixed by its seed."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from nrpt.deep import fitting, methods, replicas
from nrpt.deep.data import SYNTHETIC_CIFAR, load_dataset
from nrpt.deep.energy import NetworkTarget
from nrpt.deep.fitting import Deadline, fit
from nrpt.deep.replicas import FunctionalNet, choose_strategy
from nrpt.explorers.base import Noise, ReplicaState
from nrpt.explorers.sgmcmc import PSGLD, SGLD, MomentumSGD
from nrpt.paths.ladders import NoiseLadder


def _bn_net(dtype=torch.float32):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 4 * 4, 6), nn.BatchNorm1d(6), nn.ReLU(),
                             nn.Linear(6, 3)).to(dtype)


def _batch(net, P=3, B=8, dtype=torch.float32):
    theta0, buf0 = net.pack()
    g = torch.Generator().manual_seed(1)
    theta = theta0 + 0.1 * torch.randn(P, net.dim, generator=g, dtype=dtype)
    buf = buf0 + 0.1 * torch.rand(P, net.buffer_dim, generator=g, dtype=dtype)
    x = torch.randn(P, B, 2, 6, 6, generator=g, dtype=dtype)
    y = torch.randint(3, (P, B), generator=g)
    return theta, buf, x, y


# ------------------------------------------------------------------ BatchNorm's own update
def test_batchnorm_statistics_are_pytorchs_own_bit_for_bit_and_vmap_keeps_them():
    net = FunctionalNet(_bn_net())
    theta, buf, x, y = _batch(net)
    losses, grad, new = net.loss_and_grad(theta, buf, x, y, "loop")
    for i in range(theta.shape[0]):
        m = net.load(theta[i], buf[i]).train()
        ref = nn.functional.cross_entropy(m(x[i]), y[i], reduction="none")
        assert torch.equal(net.pack(m)[1], new[i])  # PyTorch's rule, PyTorch's kernels
        assert torch.equal(ref.detach(), losses[i])
    assert (new - buf).abs().max() > 1e-3  # negative control: the statistics moved
    _, _, new_v = net.loss_and_grad(theta, buf, x, y, "vmap")
    assert (new_v - buf).abs().max() > 1e-3  # vmap did not drop the in-place update
    torch.testing.assert_close(new_v, new, rtol=1e-5, atol=1e-6)


def _per_replica_backward(net, theta, buf, x, y, seed_scale=1.0):
    """The loop as it was: one forward and one backward pass per replica."""
    out = []
    for i in range(theta.shape[0]):
        th = theta[i].detach().requires_grad_(True)
        total, (losses, new) = net._one(th, buf[i], x[i], y[i])
        (g,) = torch.autograd.grad(seed_scale * total, th)
        out.append((losses, g, new.detach()))
    return tuple(torch.stack(parts) for parts in zip(*out, strict=True))


@pytest.mark.parametrize("make", [_bn_net, lambda: nn.Sequential(
    nn.Flatten(), nn.Linear(72, 16), nn.ReLU(), nn.Linear(16, 3))])
def test_the_loops_one_backward_pass_equals_one_per_replica_bit_for_bit(make):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = FunctionalNet(make())
    theta, buf, x, y = _batch(net, P=4)
    got = net.loss_and_grad(theta, buf, x, y, "loop")
    ref = _per_replica_backward(net, theta, buf, x, y)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)
    # negative control: a gradient computed otherwise (seed 1 + 2^-20) is told apart
    other = _per_replica_backward(net, theta, buf, x, y, 1.0 + 2.0 ** -20)
    assert not torch.equal(got[1], other[1])


@pytest.mark.parametrize("make", [_bn_net, lambda: nn.Sequential(
    nn.Flatten(), nn.Linear(72, 16), nn.ReLU(), nn.Linear(16, 3))])
def test_the_loops_kept_leaves_give_the_numbers_of_leaves_made_anew(make, monkeypatch):
    """The loop's leaves kept from call to call (views of the net's own buffer, ``theta``
    copied in) give the losses, gradients and buffers of leaves made anew each call (views of
    ``theta``: a state above KEPT_LEAVES_MAX), bit for bit, call after call at new states, a
    new replica count and a new dtype (the buffer made again).  Negative control: the
    gradient at the first state is not the one at the second (what leaves left holding the
    first state's values would give)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = FunctionalNet(make())
        fresh = FunctionalNet(make())
    calls = []
    for P, shift, dtype in ((4, 0.0, torch.float32), (4, 0.3, torch.float32),
                            (2, -0.2, torch.float32), (3, 0.1, torch.float64)):
        if dtype != net.dtype:
            net, fresh = (FunctionalNet(make().to(dtype)) for _ in range(2))
        theta, buf, x, y = _batch(net, P=P, dtype=dtype)
        theta = theta + shift
        monkeypatch.setattr(replicas, "KEPT_LEAVES_MAX", 1 << 22)
        got = net.loss_and_grad(theta, buf, x, y, "loop")
        assert net._kept[0] == (P, dtype, theta.device)
        assert torch.equal(net._kept[1], theta)  # (this call's values, copied in)
        monkeypatch.setattr(replicas, "KEPT_LEAVES_MAX", -1)
        ref = fresh.loss_and_grad(theta, buf, x, y, "loop")
        assert fresh._kept is None
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b)
        calls.append(got[1])
    assert not torch.equal(calls[0], calls[1])


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_evaluations_leave_eval_mode_and_training_steps_set_train_mode(strategy):
    """logits leaves the module in eval mode (one tree walk per run of evaluations); the next
    training-mode step sets train mode itself, and a loaded copy comes in train mode as it did.
    Negative control: the same step in eval mode (running statistics) gives other losses."""
    net = FunctionalNet(_bn_net())
    theta, buf, x, y = _batch(net)
    before = net.loss_and_grad(theta, buf, x, y, strategy)
    net.logits(theta, buf, x[0], strategy)
    assert not net.module.training
    after = net.loss_and_grad(theta, buf, x, y, strategy)
    assert net.module.training
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    net.logits(theta, buf, x[0], strategy)
    assert net.load(theta[0], buf[0]).training
    net.module.eval()
    net._training = False
    with torch.no_grad(), net._bound(net.params(theta[0]), net.buffers(buf[0])):
        evald = nn.functional.cross_entropy(net.module(x[0]), y[0], reduction="none")
    assert not torch.allclose(evald, before[0][0])


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_the_forward_only_energy_equals_the_one_with_gradients(strategy):
    net = FunctionalNet(_bn_net(torch.float64))
    theta, buf, x, y = _batch(net, dtype=torch.float64)
    l1, g1, b1 = net.loss_and_grad(theta, buf, x, y, strategy)
    l2, g2, b2 = net.loss_and_grad(theta, buf, x, y, strategy, need_grad=False)
    assert g2 is None and g1 is not None
    torch.testing.assert_close(l2, l1, rtol=0, atol=1e-12)
    torch.testing.assert_close(b2, b1, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ no noise for cold slots
class _DrawingNoise(Noise):
    """The engine's noise under another type: the explorer draws as it always did."""


def _sg_state(R=2, P=3, d=5):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(R, P, d, generator=g, dtype=torch.float64)
    return ReplicaState(x, torch.zeros(R, P, dtype=torch.float64),
                        torch.zeros(R, P, dtype=torch.float64))


class _Quadratic:
    dim = 5

    def energy(self, x):
        return 0.5 * (x * x).sum(-1) + x[..., 0] ** 3 / 10


@pytest.mark.parametrize("make", [lambda: SGLD(), lambda: MomentumSGD(momentum=0.7),
                                  lambda: PSGLD()])
def test_a_cold_step_without_noise_equals_the_step_that_draws_it(make, monkeypatch):
    from nrpt.roles import Density

    density = Density(_Quadratic(), NoiseLadder([0.0, 0.0, 0.0]))
    b = torch.full((2, 3), float("inf"), dtype=torch.float64)
    h = torch.full((2, 3), 0.05, dtype=torch.float64)
    results = []
    for noise_type in (_DrawingNoise, Noise):
        ex, st = make(), _sg_state()
        for k in range(3):
            st, _ = ex.step(st, b, h, density, noise_type(7, k, 2, 3, torch.device("cpu")))
        results.append(st)
    assert torch.equal(results[0].x, results[1].x)
    for key in results[0].extras:
        assert torch.equal(results[0].extras[key], results[1].extras[key]), key
    # the cold path draws nothing; a warm slot (negative control) still draws
    drawn = []
    plain_normal = Noise.normal
    monkeypatch.setattr(Noise, "normal", lambda self, *a, **k: drawn.append(1) or
                        plain_normal(self, *a, **k))
    ex, st = make(), _sg_state()
    ex.step(st, b, h, density, Noise(7, 0, 2, 3, torch.device("cpu")))
    assert not drawn
    b[0, 1] = 2.0
    ex.step(st, b, h, density, Noise(7, 0, 2, 3, torch.device("cpu")))
    assert drawn


# ------------------------------------------------------------------ the engines' start
def _toy(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    y = (X @ torch.randn(6, 3, generator=g)).argmax(1)
    return (X[:72], y[:72]), (X[72:], y[72:])


def _mlp():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


OPTS = dict(method="deo-star", chains=3, epochs=4, seed=3, batch_size=12, lr_min=0.02,
            lr_max=0.1, swap_rate=0.3, strategy="loop", pretrain_epochs=2, eval_every=2)


def test_no_full_data_energy_is_computed_and_the_run_is_the_one_that_computed_it(monkeypatch):
    train, test = _toy()
    fast = fit(_mlp(), train, test, **OPTS)
    assert fast.net._kept is None  # (the result keeps the net, not its training buffer)
    plain_make = methods.make_engine

    def full_start(target, explorer, temps, *args, **kwargs):
        eng = plain_make(target, explorer, temps, *args, **kwargs)
        eng.path = NoiseLadder(temps, min_slots=1)  # the old start: the full-data energy
        eng.density.path = eng.path
        v, _ = eng.density(eng.state.x)
        eng.state = ReplicaState(eng.state.x, v, eng.state.base, eng.state.extras)
        return eng

    monkeypatch.setattr(methods, "make_engine", full_start)
    monkeypatch.setattr(fitting, "make_engine", full_start)
    plain = fit(_mlp(), train, test, **OPTS)
    assert torch.equal(fast.models, plain.models)
    for key in ("accuracy", "nll_sum", "learning_rates", "correction", "round_trips"):
        assert fast.summary[key] == plain.summary[key], key
    # and the fast start never evaluates the full-data energy
    monkeypatch.setattr(methods, "make_engine", plain_make)
    monkeypatch.setattr(fitting, "make_engine", plain_make)

    def refuse(self, theta):
        raise AssertionError("the full-data energy was computed")

    monkeypatch.setattr(NetworkTarget, "energy", refuse)
    again = fit(_mlp(), train, test, **OPTS)
    assert torch.equal(again.models, fast.models)


class _Scaled(nn.Module):
    """A layer whose reset reads its current weight (so a reset must start from the model's)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.gain = nn.Parameter(torch.full((3,), 2.0))

    def reset_parameters(self):
        with torch.no_grad():
            self.gain.mul_(torch.rand(3) + 0.5)

    def forward(self, x):
        return self.lin(x) * self.gain


def test_the_initial_replicas_are_those_of_one_copy_per_replica_bit_for_bit():
    """One deep copy, reset to the model's values before each replica's reset, gives the
    replicas a fresh copy per replica gave.  Negative control: without the reset to the
    model's values the replicas differ."""
    from nrpt import rng

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(_Scaled(), nn.BatchNorm1d(3))
    net = FunctionalNet(model)

    def fresh_copies(n, seed, restore=True):
        thetas, bufs, m = [], [], None
        for r in range(n):
            m = net.load(*net.pack(model)) if restore or m is None else m
            if r > 0:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(rng.key(seed, rng.Stream.INIT, 0xDEE9, r))
                    for mod in m.modules():
                        if hasattr(mod, "reset_parameters"):
                            mod.reset_parameters()
            t, b = net.pack(m)
            thetas.append(t)
            bufs.append(b)
        return torch.stack(thetas), torch.stack(bufs)

    theta, buf = fitting._initial_replicas(net, model, 4, seed=7)
    ref = fresh_copies(4, 7)
    assert torch.equal(theta, ref[0]) and torch.equal(buf, ref[1])
    assert torch.equal(theta[0], net.pack(model)[0])
    assert not torch.equal(theta, fresh_copies(4, 7, restore=False)[0])


def test_the_initial_replicas_leave_the_nets_copy_of_the_model_as_it_was():
    """The replicas are reset in the net's own copy of the model (no deep copy per fit): its
    parameters and buffers (BatchNorm's integer count included) are the same tensors with the
    same values afterwards, also when a layer's reset fails midway; a module whose reset
    replaces a parameter or a submodule gets its own back, one whose reset adds a buffer loses
    it.
    Negative control: the reset does change them while it runs."""
    class Replacing(nn.Linear):
        def reset_parameters(self):
            super().reset_parameters()
            self.bias = nn.Parameter(torch.rand(self.out_features) + 3.0)

    class Failing(nn.Module):
        fail = False

        def reset_parameters(self):  # (and one that registers a buffer of its own)
            self.register_buffer("added", torch.ones(1))
            if self.fail:
                raise RuntimeError("reset failed")

    class Swapping(nn.Module):  # a reset that replaces a submodule
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x):
            return self.inner(x)

        def reset_parameters(self):
            self.inner = nn.Linear(2, 2)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(_Scaled(), nn.BatchNorm1d(3), Replacing(3, 2), Failing(),
                              Swapping())
    model[1].num_batches_tracked.fill_(5)
    net = FunctionalNet(model)
    held = net.module
    inner = held[4].inner
    before = [(n, t, t.detach().clone()) for n, t in
              [*held.named_parameters(), *held.named_buffers()]]
    first = {n: value for n, _, value in before}
    seen = []
    plain_pack = net.pack

    def pack(m=None):
        seen.append(m is held and not torch.equal(held[2].bias, first["2.bias"]))
        return plain_pack(m)

    net.pack = pack
    fitting._initial_replicas(net, model, 3, seed=1)
    assert seen[0] is False and seen[1:] == [True, True]  # (reset values while it runs)
    for fail in (False, True):
        held[3].fail = fail
        try:
            fitting._initial_replicas(net, model, 3, seed=1)
        except RuntimeError:
            assert fail
        after = dict([*held.named_parameters(), *held.named_buffers()])
        assert set(after) == {n for n, _, _ in before}  # (no buffer "3.added")
        assert held[4].inner is inner  # (the submodule a reset replaced, given back)
        for n, t, value in before:
            assert after[n] is t and torch.equal(t, value), n


def test_the_data_is_hashed_only_for_a_run_folder(monkeypatch, tmp_path):
    """sha256 of the data and the model is what run.json keeps: a fit without a folder (one
    process) takes none (fails on the old code, which hashed them in every fit); with one, the
    three digests are taken and recorded."""
    calls = []
    plain_digest = fitting._digest
    monkeypatch.setattr(fitting, "_digest", lambda *t: calls.append(1) or plain_digest(*t))
    train, test = _toy()
    opts = dict(OPTS, pretrain_epochs=0, epochs=1)
    fit(_mlp(), train, test, **opts)
    assert calls == []
    fit(_mlp(), train, test, out=tmp_path / "run", **opts)
    assert len(calls) == 3
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["data"]["train"] == plain_digest(*train)


def test_the_engines_start_is_one_pass_read_by_the_ladder_the_noise_sd_and_the_first_step(
        monkeypatch):
    """The ladder's first energies, the correction gain's noise sd and the explorer's first
    move read one pass at the start (key START, with its gradient): a fit of K iterations
    makes K + 1 estimates, all with gradients, and its first move is made with the gradient
    the estimator gives at the start replicas with START's batch, bit for bit.  Negative
    control: without the hand-over (``start_with`` a no-op) the fit makes K + 2 estimates
    and its first move's gradient is another batch's."""
    from nrpt import rng
    from nrpt.deep.energy import NetworkEnergy
    from nrpt.explorers.sgmcmc import SGHMC, SGExplorer

    train, test = _toy()
    opts = dict(OPTS, pretrain_epochs=0, epochs=1)
    calls, moves = [], []
    plain_call, plain_move = NetworkEnergy.__call__, SGHMC.move

    def counting(self, x, key, extras, need_grad=True):
        calls.append((tuple(key)[:2], need_grad))
        return plain_call(self, x, key, extras, need_grad)

    def first_move(self, x, g, eta, tau, extras, xi):
        if not moves:
            moves.append((x.clone(), g.clone(), self.estimator))
        return plain_move(self, x, g, eta, tau, extras, xi)

    def at_start(x, est):  # the estimator's gradient at x with START's batch
        key = rng.Key((OPTS["seed"], methods.START))
        return est(x, key, est.init_extras(x, key), need_grad=True).grad

    monkeypatch.setattr(NetworkEnergy, "__call__", counting)
    monkeypatch.setattr(SGHMC, "move", first_move)
    shared = fit(_mlp(), train, test, **opts)
    iters = shared.summary["iterations"]
    assert len(calls) == iters + 1 and all(grad for _, grad in calls)
    assert calls[0][0] == (OPTS["seed"], methods.START)
    x0, g0, est = moves[0]
    assert torch.equal(g0, at_start(x0, est))

    monkeypatch.setattr(SGExplorer, "start_with", lambda self, state, estimate: state)
    calls.clear(), moves.clear()
    own = fit(_mlp(), train, test, **opts)
    assert len(calls) == iters + 2
    x0, g0, est = moves[0]
    assert not torch.equal(g0, at_start(x0, est))
    assert not torch.equal(own.models, shared.models)
    monkeypatch.undo()
    ladder = methods.MinibatchLadder([0.0, 0.0], NetworkEnergy(NetworkTarget(
        FunctionalNet(_mlp()), *train), 12), seed=1)
    x = torch.zeros(1, 2, ladder.estimator.target.dim)
    key = rng.Key((1, methods.START))
    first = ladder.start_estimate(x, key)
    assert ladder.start_estimate(x.clone(), key) is not first
    ladder.start_estimate(x, key)
    assert ladder.start_estimate(x, rng.Key((2, methods.START))) is not first


# ------------------------------------------------------------------ the strategy choice
@pytest.mark.parametrize("loop_over_vmap,expected", [(0.98, "vmap"), (0.93, "vmap"),
                                                     (1.3, "vmap"), (0.8, "loop")])
def test_auto_keeps_vmap_unless_loop_is_clearly_faster(monkeypatch, loop_over_vmap, expected):
    def fake_time(net, strategy, theta, buf, x, y, repeats):
        return {"loop": loop_over_vmap, "vmap": 1.0}.get(strategy, 1.0) * (repeats > 0)

    monkeypatch.setattr(replicas, "_time", fake_time)
    net = FunctionalNet(_bn_net())
    theta, buf, x, y = _batch(net)
    choice, timings = choose_strategy(net, theta, buf, x, y, "auto")
    assert choice == expected and timings["loop"] == pytest.approx(loop_over_vmap)


@pytest.mark.parametrize("loop_over_vmap,pairs,expected", [(0.5, 1, "loop"), (2.0, 1, "vmap"),
                                                           (0.95, 3, "vmap"), (0.8, 3, "loop")])
def test_a_clear_first_pair_ends_the_probe(monkeypatch, loop_over_vmap, pairs, expected):
    """The probe is a fixed cost of every fit: a first (loop, vmap) pair far from the switch
    decides alone, a near one is measured ``repeats`` times (fails on the old probe, which
    always timed three pairs, each after a warm-up of its own)."""
    calls = []

    def fake_time(net, strategy, theta, buf, x, y, repeats):
        calls.append((strategy, repeats))
        return {"loop": loop_over_vmap, "vmap": 1.0}.get(strategy, 1.0) * (repeats > 0)

    monkeypatch.setattr(replicas, "_time", fake_time)
    net = FunctionalNet(_bn_net())
    choice, _ = choose_strategy(net, *_batch(net), "auto")
    assert choice == expected
    timed = [c for c in calls if c[1] > 0]
    assert timed == [("loop", 1), ("vmap", 1)] * pairs
    assert [c for c in calls if c[1] == 0] == [("vmap", 0), ("loop", 0)]  # the warm-ups


def test_auto_remembers_its_timings_per_machine_and_model(monkeypatch, tmp_path):
    """A second fit of the same model, batch and replica count on this machine takes no probe
    and makes the same choice; its summary says the timings were remembered.  Negative
    controls: with the cache off, or another batch size (another key), it probes again; an
    unreadable cache file is probed over and rewritten."""
    cache = tmp_path / "strategy.json"
    monkeypatch.setenv(replicas.STRATEGY_CACHE_ENV, str(cache))
    timed = []
    ratio = {"loop": 0.5, "vmap": 1.0}  # a clear first pair: loop

    def fake_time(net, strategy, theta, buf, x, y, repeats):
        timed.append((strategy, repeats))
        return ratio[strategy] * 1e-3 * (repeats > 0)

    monkeypatch.setattr(replicas, "_time", fake_time)
    train, test = _toy()
    opts = dict(OPTS, strategy="auto", pretrain_epochs=0, epochs=1)
    first = fit(_mlp(), train, test, **opts)
    assert timed and first.summary["strategy"] == "loop"
    assert "remembered" not in first.summary["strategy_timings_s"]
    assert len(json.loads(cache.read_text())) == 1
    timed.clear()
    ratio["loop"] = 3.0  # (a new probe would now pick vmap)
    second = fit(_mlp(), train, test, **opts)
    assert timed == [] and second.summary["strategy"] == "loop"
    assert second.summary["strategy_timings_s"] == {"loop": 5e-4, "vmap": 1e-3,
                                                    "remembered": 1.0}
    # negative controls: another key, the cache turned off, an unreadable file
    assert fit(_mlp(), train, test, **dict(opts, batch_size=8)).summary["strategy"] == "vmap"
    assert timed and len(json.loads(cache.read_text())) == 2
    timed.clear()
    monkeypatch.setenv(replicas.STRATEGY_CACHE_ENV, "0")
    assert replicas.strategy_cache() is None
    assert fit(_mlp(), train, test, **opts).summary["strategy"] == "vmap" and timed
    monkeypatch.setenv(replicas.STRATEGY_CACHE_ENV, str(cache))
    cache.write_text("{not json")
    timed.clear()
    assert fit(_mlp(), train, test, **opts).summary["strategy"] == "vmap" and timed
    assert len(json.loads(cache.read_text())) == 1


def test_the_remembered_timings_are_keyed_by_what_they_depend_on():
    """Another architecture, replica count, batch shape, dtype or thread count is another key;
    the same ones (a new copy of the model) are the same key."""
    net = FunctionalNet(_bn_net())
    theta, buf, x, y = _batch(net)
    key = replicas._probe_key(net, theta, x, y)
    assert replicas._probe_key(FunctionalNet(_bn_net()), theta, x, y) == key
    wider = FunctionalNet(nn.Sequential(nn.Conv2d(2, 5, 3), nn.BatchNorm2d(5), nn.ReLU(),
                                        nn.Flatten(), nn.Linear(5 * 4 * 4, 3)))
    others = [replicas._probe_key(wider, theta, x, y),
              replicas._probe_key(net, theta[:2], x[:2], y[:2]),
              replicas._probe_key(net, theta, x[:, :4], y[:, :4]),
              replicas._probe_key(FunctionalNet(_bn_net(torch.float64)), theta.double(),
                                  x.double(), y)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        others.append(replicas._probe_key(net, theta, x, y))
    finally:
        torch.set_num_threads(threads)
    assert len({key, *others}) == 1 + len(others)


def test_a_model_vmap_cannot_run_is_not_remembered(monkeypatch, tmp_path):
    """Only timed decisions are kept: a model that vmap fails on is probed, and warned about,
    every time."""
    monkeypatch.setenv(replicas.STRATEGY_CACHE_ENV, str(tmp_path / "s.json"))

    def fails(net, strategy, *a):
        if strategy == "vmap":
            raise RuntimeError("no batching rule")
        return 1e-3

    monkeypatch.setattr(replicas, "_time", fails)
    net = FunctionalNet(_bn_net())
    for _ in range(2):
        with pytest.warns(replicas.StrategyWarning, match="failed on this model"):
            assert choose_strategy(net, *_batch(net), "auto", remember=True)[0] == "loop"
    assert not (tmp_path / "s.json").exists()


def test_the_timed_steps_take_no_warm_up_of_their_own(monkeypatch):
    net = FunctionalNet(_bn_net())
    n = []
    plain = FunctionalNet.loss_and_grad
    monkeypatch.setattr(FunctionalNet, "loss_and_grad",
                        lambda self, *a, **k: n.append(1) or plain(self, *a, **k))
    theta, buf, x, y = _batch(net)
    replicas._time(net, "loop", theta, buf, x, y, 0)
    replicas._time(net, "loop", theta, buf, x, y, 2)
    assert len(n) == 3  # (the old _time called it once more before the timed ones)


# ------------------------------------------------------------------ evaluations and recorders
def test_slot_zeros_test_logits_are_evaluated_once_per_epoch_and_read_back(monkeypatch):
    """The model average and the per-epoch rows both want slot 0's test logits at an epoch's
    end: one evaluation serves both, with the same numbers as evaluating it twice (fails on
    the old recorders: P + 1 evaluations per epoch)."""
    from nrpt.deep import placement

    train, test = _toy()
    opts = dict(OPTS, pretrain_epochs=0, eval_every=1, burn_in=0.0)
    calls = []
    plain_logits = FunctionalNet.logits

    def counting(self, theta, buf, x, *a, **k):
        if x.shape[0] == test[0].shape[0]:
            calls.append(theta.shape[0])
        return plain_logits(self, theta, buf, x, *a, **k)

    monkeypatch.setattr(FunctionalNet, "logits", counting)
    once = fit(_mlp(), train, test, **opts)
    epochs = len(once.metrics)
    assert epochs == 4 and len(calls) == epochs * opts["chains"]

    # without the memo (each caller evaluates): the same rows, models and average
    def no_memo(self, net, x_test, strategy):
        def one(theta, bn, row):
            return net.logits(theta[None].to(net.dtype), bn[None].to(net.dtype), x_test,
                              strategy)[0]
        return one

    monkeypatch.setattr(placement.Placement, "test_logits", no_memo)
    calls.clear()
    twice = fit(_mlp(), train, test, **opts)
    assert len(calls) == epochs * (opts["chains"] + 1)
    assert once.metrics == twice.metrics
    assert torch.equal(once.models, twice.models)
    assert torch.equal(once.predict_proba(test[0]), twice.predict_proba(test[0]))
    for key in ("accuracy", "nll_sum", "ece", "round_trips"):
        assert once.summary[key] == twice.summary[key], key


def test_round_trips_recorded_per_iteration_are_counted_as_updated_one_by_one():
    """RoundTrips buffers the rows of single iterations as it does a chunk's (one prefix scan
    per PENDING iterations): the counts read at any iteration are the tracker's own, updated
    iteration by iteration.  Negative control: the rows in another order count otherwise."""
    from types import SimpleNamespace

    from nrpt.diagnostics import RoundTripTracker
    from nrpt.recorders.stats import RoundTrips

    R, P, K = 2, 4, 150
    g = torch.Generator().manual_seed(5)
    slot_of = torch.arange(P).expand(R, P).clone()
    rows = []
    for _ in range(K):  # adjacent swaps, as DEO makes them
        s = rows[-1].clone() if rows else slot_of.clone()
        for r in range(R):
            p = int(torch.randint(P - 1, (1,), generator=g))
            a, b = (s[r] == p).nonzero()[0, 0], (s[r] == p + 1).nonzero()[0, 0]
            s[r, a], s[r, b] = p + 1, p
        rows.append(s)
    rec, ref = RoundTrips(slot_of, P), RoundTripTracker(slot_of, P)
    for k, s in enumerate(rows):
        rec.record(SimpleNamespace(slot_of=s))
        ref.update(s)
        if k % 37 == 0 or k == K - 1:
            got = rec.counts()
            for key in ("restarts", "round_trips", "round_trips_a5"):
                assert torch.equal(got[key], getattr(ref, key)), (k, key)
    assert int(ref.round_trips.sum()) > 0 and rec.n == K
    shuffled = RoundTripTracker(slot_of, P)
    for s in rows[::-1]:
        shuffled.update(s)
    assert not torch.equal(shuffled.restarts, ref.restarts) or \
        not torch.equal(shuffled.round_trips, ref.round_trips)


@pytest.mark.parametrize("folder", [False, True])
def test_the_index_process_is_copied_to_the_host_in_blocks_and_read_whole(tmp_path, folder):
    """IndexRecorder keeps up to PENDING rows on the device: every reader (the array, a
    checkpoint, index.npy after one) sees every row recorded so far, in order, at any count;
    a checkpoint taken mid-block resumes to the same rows.  Negative control: rows reversed
    differ."""
    from types import SimpleNamespace

    import numpy as np

    from nrpt.deep.recorders import INDEX_FILE, IndexRecorder

    P, K = 4, 150
    g = torch.Generator().manual_seed(2)
    rows = [torch.randperm(P, generator=g)[None] for _ in range(K)]
    want = torch.cat(rows).numpy()
    rec = IndexRecorder(P, K, tmp_path if folder else None)
    sd = None
    for k, s in enumerate(rows):
        rec.record(SimpleNamespace(slot_of=s, k=k))
        if k + 1 == 70:  # mid-block: the checkpoint writes the pending rows
            sd = rec.state_dict()
            if folder:
                assert np.array_equal(np.load(tmp_path / INDEX_FILE)[:70], want[:70])
            assert np.array_equal(rec.array(), want[:70])
    assert np.array_equal(rec.array(), want)
    again = IndexRecorder(P, K, tmp_path if folder else None)
    again.load_state_dict(sd)
    for k, s in enumerate(rows[70:], start=70):
        again.record(SimpleNamespace(slot_of=s, k=k))
    assert np.array_equal(again.array(), want)
    assert not np.array_equal(want[::-1], want)


# ------------------------------------------------------------------ the time budget
class _Clock:
    """A clock that advances one second each time it is read."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_a_run_stopped_by_its_time_budget_writes_outputs_and_resumes_bit_for_bit(tmp_path,
                                                                                monkeypatch):
    train, test = _toy()
    whole = fit(_mlp(), train, test, **OPTS)
    iters = whole.summary["iterations"]
    # Deadline reads its clock when made and once per iteration: a budget of 10.5 "seconds"
    # stops the pretraining (12 iterations) after its 10th iteration
    monkeypatch.setattr(Deadline, "clock", _Clock())
    out = tmp_path / "run"
    part = fit(_mlp(), train, test, out=out, max_seconds=10.5, **OPTS)
    assert part.summary["interrupted"] and part.summary["stopped_by"] == "max_seconds"
    assert part.summary["phase"] == "pretraining"
    # the next session stops in the main run: its outputs are written
    monkeypatch.setattr(Deadline, "clock", _Clock())
    part = fit(_mlp(), train, test, out=out, resume=True, max_seconds=8.5, **OPTS)
    assert part.summary["stopped_by"] == "max_seconds"
    assert 0 < part.summary["iterations"] < iters
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_by"] == "max_seconds"
    done = fit(_mlp(), train, test, out=out, resume=True, **OPTS)
    assert not done.summary["interrupted"] and "stopped_by" not in done.summary
    assert torch.equal(done.models, whole.models)
    for key in ("accuracy", "nll_sum", "learning_rates", "correction", "round_trips",
                "swap_rates"):
        assert done.summary[key] == whole.summary[key], key


def test_max_seconds_is_checked_by_name():
    train, test = _toy()
    for bad in (0, -1.0, float("inf"), "10", True):
        with pytest.raises(ValueError, match="max_seconds"):
            fit(_mlp(), train, test, max_seconds=bad, **OPTS)


# ------------------------------------------------------------------ synthetic CIFAR
def test_synthetic_cifar_has_cifars_shapes_and_is_fixed_by_its_seed():
    a = load_dataset("synthetic-cifar", seed=0)
    assert a.x_train.shape == (SYNTHETIC_CIFAR["train"], 3, 32, 32)
    assert a.x_test.shape == (SYNTHETIC_CIFAR["test"], 3, 32, 32)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert a.classes == 100 and a.input_shape == (3, 32, 32)
    assert int(a.y_train.min()) >= 0 and int(a.y_train.max()) < 100
    assert len(a.y_train.unique()) > 90  # (nearly) every class present
    b = load_dataset("synthetic-cifar", seed=0)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = load_dataset("synthetic-cifar", seed=1)
    assert not torch.equal(a.x_train, c.x_train)
    g = torch.Generator().manual_seed(0)
    out = a.augment(a.x_train[:4], g)
    assert out.shape == (4, 3, 32, 32) and not torch.equal(out, a.x_train[:4])


def test_nrpt_deep_max_seconds_stops_says_how_to_go_on_and_resume_finishes(tmp_path, capsys,
                                                                            monkeypatch):
    from nrpt.run.cli import main

    with pytest.raises(SystemExit):
        main(["deep", "--dataset", "digits", "--max-seconds", "0"])
    assert "--max-seconds must be a number of seconds > 0" in capsys.readouterr().err
    out = tmp_path / "run"
    args = ["deep", "--dataset", "digits", "--chains", "2", "--epochs", "1", "--out", str(out),
            "--no-progress", "--pretrain-epochs", "0", "--batch-size", "64", "--strategy",
            "loop", "--swap-rate", "0.2", "--max-seconds", "3.5"]
    monkeypatch.setattr(Deadline, "clock", _Clock())  # 3 iterations, then the budget is spent
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"stopped by --max-seconds (3.5 s); continue with: nrpt resume {out}" in text
    assert json.loads((out / "cli.json").read_text())["max_seconds"] == 3.5
    assert json.loads((out / "summary.json").read_text())["iterations"] == 3
    monkeypatch.setattr(Deadline, "clock", _Clock())  # `nrpt resume`: the same budget
    assert main(["resume", str(out), "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["iterations"] == 6
    assert main(["deep", "--resume", str(out), "--no-progress", "--max-seconds", "1e6"]) == 0
    done = json.loads((out / "summary.json").read_text())
    assert not done["interrupted"] and done["iterations"] == 22  # ceil(1346 / 64) x 1 epoch


# ------------------------------------------------------------------ stop 36: fewer copies
class _Unused(nn.Module):
    """A model one of whose parameters the loss never reaches."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(72, 3)
        self.spare = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.lin(x.flatten(1))


def test_the_loops_parameter_leaves_give_zeros_for_a_parameter_the_loss_does_not_reach():
    """The loop's leaves are each replica's parameters (no split of one flat leaf): a
    parameter outside the graph still gets the zero gradient the split's backward gave, and
    the rest is the per-replica backward's, bit for bit.  Negative control: the gradient of a
    perturbed replica differs."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = FunctionalNet(_Unused())
    theta, buf, x, y = _batch(net, P=3)
    losses, grad, _ = net.loss_and_grad(theta, buf, x, y, "loop")
    ref = _per_replica_backward(net, theta, buf, x, y)
    assert torch.equal(losses, ref[0]) and torch.equal(grad, ref[1])
    spare = net.names.index("spare")
    lo = sum(net.numels[:spare])
    assert torch.equal(grad[:, lo:lo + 4], torch.zeros(3, 4))
    moved = theta.clone()
    moved[1, -1] += 0.5  # (a bias of the linear layer)
    assert not torch.equal(net.loss_and_grad(moved, buf, x, y, "loop")[1][1], grad[1])


@pytest.mark.parametrize("method", ["deo", "ensemble", "cyclical", "swag"])
def test_every_engine_of_every_method_makes_one_start_pass_and_hands_its_gradient_over(
        monkeypatch, method):
    """With pretraining (two engines) and a BatchNorm net, each engine's start is one pass
    with the gradient at START, and no explorer step makes an estimate beyond its move's: a
    fit makes (explorer steps) + (engines) estimates.  The memo keeps no gradient after the
    hand-over, nor the start state once the engine has moved on.  (Negative control: the
    deo-star test above, without the hand-over.)"""
    from nrpt.deep.energy import NetworkEnergy
    from nrpt.explorers.sgmcmc import SGExplorer

    train, test = _toy()
    calls, ladders, steps = [], [], []
    plain_call, plain_init = NetworkEnergy.__call__, methods.MinibatchLadder.__init__
    plain_step = SGExplorer.step

    def counting(self, x, key, extras, need_grad=True):
        calls.append((tuple(key)[1], need_grad))
        return plain_call(self, x, key, extras, need_grad)

    def init(self, *a, **k):
        plain_init(self, *a, **k)
        ladders.append(self)

    def step(self, *a, **k):
        steps.append(1)
        return plain_step(self, *a, **k)

    monkeypatch.setattr(NetworkEnergy, "__call__", counting)
    monkeypatch.setattr(methods.MinibatchLadder, "__init__", init)
    monkeypatch.setattr(SGExplorer, "step", step)
    opts = dict(OPTS, method=method, pretrain_epochs=1, epochs=2)
    if method != "deo":
        opts.pop("swap_rate"), opts.pop("lr_min")
    fit(_mlp(), train, test, **opts)
    assert len(ladders) == 2  # pretraining and the main run
    starts = [c for c in calls if c[0] == methods.START]
    assert len(starts) == 2 and all(grad for _, grad in calls)
    assert len(calls) == len(steps) + 2
    assert all(lad._start is None or lad._start[3].grad is None for lad in ladders)
    # (nor the start state, once the engine has moved on from it)
    assert all(lad._start is None or lad._start[0]() is None for lad in ladders)


@pytest.mark.compile
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside torch's compiler
def test_a_compiled_fit_traces_its_start_pass_as_its_training_steps(monkeypatch, tmp_path):
    """strategy="compile": the start pass (made under the engine's no_grad, with its gradient)
    runs with autograd on, as every training step, so the compiled step is traced once.
    Negative control: the pass made in the caller's no_grad (the mistake this guards against)
    makes Dynamo trace it a second time (a grad-mode guard fails)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("NRPT_COMPILE_CACHE", str(tmp_path / "cache"))
    train, test = _toy()
    opts = dict(OPTS, method="ensemble", pretrain_epochs=0, epochs=1, strategy="compile")
    opts.pop("swap_rate"), opts.pop("lr_min")

    def graphs():
        torch._dynamo.reset()
        counters.clear()
        fit(_mlp(), train, test, **opts)
        return counters["stats"]["unique_graphs"]

    assert graphs() == 1
    plain = methods.MinibatchLadder.start_estimate

    def under_no_grad(self, x, key):
        with torch.no_grad():
            est = self.estimator
            return est(x, key, est.init_extras(x, key), need_grad=self.gradient)

    monkeypatch.setattr(methods.MinibatchLadder, "start_estimate", under_no_grad)
    assert graphs() == 2
    monkeypatch.setattr(methods.MinibatchLadder, "start_estimate", plain)


def _within_rounding(got: torch.Tensor, exact: torch.Tensor, size: torch.Tensor) -> bool:
    """Whether float32 ``got`` is ``exact`` (float64) to the rounding of a sum of terms whose
    magnitudes add to ``size``: within 2^-23 * size, one float32 ulp of the terms, elementwise
    (a fused multiply-add rounds once, the two-step formula twice: both are within it)."""
    return bool(((got.double() - exact).abs() <= 2.0 ** -23 * size).all())


def test_the_energys_gradient_and_the_momentum_step_are_their_formulas_to_rounding():
    """The minibatch gradient (scaled in place, the weight decay added by one fused pass) and
    the momentum SGD move (the step taken from the new momentum by one addcmul_) are their
    formulas, made exactly in float64, to one float32 rounding of their terms; the inputs are
    left as they were.  Negative control: a term scaled by 1 + 2^-20 (8 ulps) is told apart."""
    from nrpt import rng
    from nrpt.deep.energy import NetworkEnergy

    train, _ = _toy()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = FunctionalNet(_mlp())
    target = NetworkTarget(net, *train, weight_decay=5e-4, strategy="loop")
    est = NetworkEnergy(target, 12)
    g = torch.Generator().manual_seed(2)
    theta0, _ = net.pack()
    x = theta0 + 0.3 * torch.randn(1, 3, net.dim, generator=g)
    kept = x.clone()
    key = rng.Key((5, 1))
    extras = est.init_extras(x, key)
    got = est(x, key, extras)
    idx = est.batches(key, (1, 3), x.device).reshape(3, -1)
    losses, gr, _ = net.loss_and_grad(x[0], extras["bn"][0], train[0][idx], train[1][idx],
                                      "loop")
    scale = target.n_data / 12
    data = scale * gr  # (the in-place scaling: a float32 product, rounded once)
    decay = torch.tensor(target.n_data * target.weight_decay).float().double() * x[0].double()
    size = data.double().abs() + decay.abs()
    assert _within_rounding(got.grad[0], data.double() + decay, size) and torch.equal(x, kept)
    # (negative control: the data term scaled by 1 + 2^-20 is told apart)
    assert not _within_rounding(got.grad[0], (1.0 + 2.0 ** -20) * data.double() + decay, size)
    # the momentum move
    ex = MomentumSGD(momentum=0.9)
    m = torch.randn(1, 3, net.dim, generator=g)
    eta = torch.tensor([0.01, 0.02, 0.04]).reshape(1, 3, 1)
    m_kept = m.clone()
    x_new, out = ex.move(x, got.grad, eta, torch.zeros_like(eta), {"momentum": m}, None)
    kept_m = (0.9 * m).double()  # (momentum * m: a float32 product, rounded once)
    step = eta.double() * got.grad.double()
    size_m = kept_m.abs() + step.abs()
    assert _within_rounding(out["momentum"], kept_m - step, size_m)
    assert torch.equal(x_new, x + out["momentum"]) and torch.equal(m, m_kept)
    assert not _within_rounding(out["momentum"], kept_m - (1.0 + 2.0 ** -20) * step, size_m)
    # a float64 step size against float32 rows promotes as the formula does (out of place)
    eta64 = eta.double()
    _, out64 = ex.move(x, got.grad, eta64, torch.zeros_like(eta64), {"momentum": m}, None)
    assert out64["momentum"].dtype == torch.float64
    assert torch.equal(out64["momentum"], 0.9 * m - eta64 * got.grad)


def test_cpu_replicas_are_seeded_without_torch_manual_seed(monkeypatch):
    """On the CPU the initial replicas' resets and the dropout masks draw from the CPU
    generator seeded directly: the same numbers torch.manual_seed gave (the initial-replica
    test above compares with it), without its lazy seeding of every other device kind.
    Negative control: the keyed dropout still changes with its seed."""
    from nrpt import rng

    calls = []
    plain_seed = torch.manual_seed
    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    net = FunctionalNet(m)
    theta, buf = net.pack()
    X, y = _toy(n=8)[0]
    args = (theta.expand(2, -1), buf.expand(2, -1), X[:8].expand(2, 8, 6), y[:8].expand(2, 8),
            "loop")
    a = net.loss_and_grad(*args, seed=rng.key(1, 2))
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s) or plain_seed(s))
    fitting._initial_replicas(net, m, 3, seed=4)
    b = net.loss_and_grad(*args, seed=rng.key(1, 2))
    c = net.loss_and_grad(*args, seed=rng.key(1, 3))
    assert calls == []
    monkeypatch.undo()

    def with_manual_seed(seed):  # the masks torch.manual_seed gives
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed % 2 ** 63)
            return net._loop(*args[:4])

    ref = with_manual_seed(rng.key(1, 2))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert torch.equal(a[0], ref[0]) and torch.equal(a[1], ref[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("make", [lambda: SGLD(), lambda: MomentumSGD(momentum=0.7),
                                  lambda: PSGLD()])
def test_a_warm_move_adds_the_noise_term_as_written(make):
    """With noise drawn, the moves add ``sqrt(scale) * xi`` with the scale made only then
    (a function: cold steps skip it), the numbers of the formulas written out.  Negative
    control: a scale off by a factor 1 + 2^-20 is told apart."""
    g = torch.Generator().manual_seed(3)
    x, grad, xi = (torch.randn(2, 3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    eta = torch.rand(2, 3, 1, generator=g, dtype=torch.float64) / 10
    tau = torch.rand(2, 3, 1, generator=g, dtype=torch.float64)
    ex = make()
    extras = {"momentum": torch.randn(2, 3, 5, generator=g, dtype=torch.float64),
              "precond_sq": torch.rand(2, 3, 5, generator=g, dtype=torch.float64)}
    got, out = ex.move(x, grad, eta, tau, dict(extras), xi)

    def formula(f=1.0):
        if isinstance(ex, MomentumSGD):
            m = ex.momentum * extras["momentum"] - eta * grad
            m = m + torch.sqrt(f * (2.0 * (1.0 - ex.momentum) * eta * tau)) * xi
            return x + m
        if isinstance(ex, PSGLD):
            v = ex.rho * extras["precond_sq"] + (1.0 - ex.rho) * grad * grad
            G = 1.0 / (ex.eps + v.sqrt())
            return x - eta * G * grad + torch.sqrt(f * (2.0 * eta * tau * G)) * xi
        return x - eta * grad + torch.sqrt(f * (2.0 * eta * tau)) * xi

    assert torch.equal(got, formula())
    assert not torch.equal(got, formula(1.0 + 2.0 ** -20))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_data", [72, 50_000])
def test_the_energys_scalars_made_in_numpy_are_torchs_bit_for_bit(dtype, n_data):
    """The minibatch energy ``(N / B) sum(losses) + N wd / 2 |theta|^2`` and its plug-in
    variance, whose scalar arithmetic on the ``[n]`` vectors is made in NumPy on the CPU, equal
    the torch formulas (the prior as ``NetworkTarget.prior_energy`` makes it), bit for bit, for
    float32 and float64 and a large N (N^2 above float32's integers).  Negative control: the
    variance divided by B + 1 is told apart."""
    from nrpt.deep import energy

    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = FunctionalNet(_mlp().to(dtype))
    g = torch.Generator().manual_seed(4)
    X = torch.randn(n_data if n_data < 1000 else 64, 6, generator=g, dtype=dtype)
    target = NetworkTarget(net, X, torch.zeros(X.shape[0], dtype=torch.long),
                           weight_decay=5e-4, strategy="loop")
    target.n_data = n_data  # (what the formulas read: N)
    est = energy.NetworkEnergy(target, 12)
    est.n_data = n_data
    losses = 3.0 * torch.rand(5, 12, generator=g, dtype=dtype)
    theta = torch.randn(5, net.dim, generator=g, dtype=dtype)
    u, var = est._scalars(losses, (theta * theta).sum(-1))
    assert energy._numpy_exact(losses, theta)
    scale, fpc = n_data / 12, 1.0 - 12 / n_data
    want_u = scale * losses.sum(-1) + target.prior_energy(theta)
    want_v = n_data ** 2 * losses.var(-1) / 12 * fpc
    assert u.dtype == dtype and var.dtype == dtype
    assert torch.equal(u, want_u) and torch.equal(var, want_v)
    assert not torch.equal(var, n_data ** 2 * losses.var(-1) / 13 * fpc)
    # the torch path (another device, or autograd) gives the same numbers
    assert not energy._numpy_exact(losses.requires_grad_(True))
    with torch.no_grad():
        u2, v2 = est._scalars(losses, (theta * theta).sum(-1))
    assert torch.equal(u2, want_u) and torch.equal(v2, want_v)


def test_the_batches_rows_are_the_indices_by_replica():
    """``EpochBatches.rows`` is ``__call__``'s ``[*lead, B]`` as ``[R * w, B]`` (the global
    ids of a block cached per shape and block), for a plain key and a key with a block."""
    from nrpt import rng
    from nrpt.deep.energy import EpochBatches
    from nrpt.rng import Block

    eb = EpochBatches(50, 8)
    for k in (0, 6, 7, 13):
        key = rng.Key((3, k))
        rows = eb.rows(key, (1, 4), "cpu")
        assert torch.equal(rows, eb(key, (1, 4), "cpu").reshape(4, 8))
        blocked = rng.Key((3, k), Block(2, 4, 4))
        assert torch.equal(eb.rows(blocked, (1, 2), "cpu"), rows[2:])
        assert not torch.equal(eb.rows(blocked, (1, 2), "cpu"), rows[:2])


def test_the_per_epoch_swap_counts_summed_in_numpy_equal_torchs(monkeypatch):
    """The per-epoch rows' swap and verdict counts, summed each iteration in NumPy views of
    the accumulator on the CPU, equal those summed by torch (the path of other devices), and
    so does the whole run; the checkpointed accumulator is the tensor the views write into.
    Negative control: the rows count swaps (a rate above 0 somewhere)."""
    from nrpt.deep import recorders

    train, test = _toy()
    fast = fit(_mlp(), train, test, **{**OPTS, "swap_rate": 0.5})
    monkeypatch.setattr(recorders, "viewable", lambda *ts, dtypes=None: False)
    plain = fit(_mlp(), train, test, **{**OPTS, "swap_rate": 0.5})
    def timeless(s):
        return {k: v for k, v in s.items() if not k.endswith("time_s")}

    assert fast.metrics == plain.metrics and timeless(fast.summary) == timeless(plain.summary)
    assert any((row["swap_rate"] or 0) > 0 for row in fast.metrics)
    em = recorders.EpochMetrics.__new__(recorders.EpochMetrics)
    em._acc, em._rows, em.rows = torch.zeros(4, 1, 2), None, []
    monkeypatch.setattr(recorders, "viewable", lambda *ts, dtypes=None: True)

    class It:
        attempted_indicators = (torch.tensor([[1.0, 0.0]]), torch.tensor([[True, False]]))
        pair_indicators = (torch.tensor([[1.0, 1.0]]), torch.tensor([[True, True]]))
        k, every = 0, 5
    em.every = 5
    em.record(It())
    em.record(It())
    assert torch.equal(em.state_dict()["acc"][:, 0], torch.tensor(
        [[2.0, 0.0], [2.0, 0.0], [2.0, 2.0], [2.0, 2.0]]))


def test_fit_inside_a_callers_inference_mode_trains_as_outside():
    """fit trains with autograd whatever the caller's mode: inside torch.inference_mode(),
    with the model and data made there too (inference tensors), it gives the fit made outside,
    bit for bit (before, the start pass failed: "element 0 of tensors does not require
    grad").  The caller's mode is left as it was."""
    train, test = _toy()
    outside = fit(_mlp(), train, test, **OPTS)
    with torch.inference_mode():
        tr, te = _toy()
        inside = fit(_mlp(), tr, te, **OPTS)
        assert torch.is_inference_mode_enabled()
    assert torch.equal(inside.models, outside.models)
    assert inside.summary["iterations"] == outside.summary["iterations"]
