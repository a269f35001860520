"""The batched engine against a plain per-replica loop, exact round-trip counts, DEO_W's
guarantees, bad input, non-finite targets, reproducibility and resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nrpt
from nrpt import rng
from nrpt.core.loop import Plan, Run, execute
from nrpt.explorers import HMC, MALA, Noise, ReplicaState
from nrpt.explorers.base import Explorer
from nrpt.explorers.metropolis import metropolis_select
from nrpt.recorders.stats import RoundTrips, SwapStats
from nrpt.run.registry import make_rule
from nrpt.swap import AlwaysAccept


class Quartic:
    """A 1-D double well U(x) = (x^2 - 4)^2 / 4 (energy target)."""

    dim = 1
    name = "quartic"

    def energy(self, x):
        return (x[:, 0] ** 2 - 4.0) ** 2 / 4.0


def make_engine(scheme="deo", window=1, R=2, temps=(1.0, 2.0, 4.0, 8.0), step=0.8, seed=3,
                explorer="rwmh", rule=None, target=None):
    target = target or Quartic()
    path = nrpt.TemperatureLadder(list(temps))
    ex = nrpt.make_explorer(explorer) if isinstance(explorer, str) else explorer
    return nrpt.PTEngine(target, path, ex,
                         nrpt.make_scheme(scheme, window), rule or make_rule("metropolis"),
                         step_size=[step * math.sqrt(t) for t in temps], systems=R, seed=seed)


# ---------------------------------------------------------------- reference loop
def reference_run(engine_factory, scheme: str, K: int):
    """A plain per-system, per-replica, per-pair loop with the same keyed random numbers."""
    eng = engine_factory()
    R, P, seed = eng.R, eng.P, eng.seed
    b = eng.schedule[0].tolist()
    h = eng.step_size[0].tolist()
    U = eng.target.energy
    x = [[eng.state.x[s, r].clone() for r in range(P)] for s in range(R)]
    slot_of = [list(range(P)) for _ in range(R)]
    history = []
    for k in range(K):
        noise = Noise(seed, k, R, P, "cpu")
        xi, u = noise.normal(0, (1,), torch.float64), noise.uniform(0, torch.float64)
        for s in range(R):
            for r in range(P):
                bp, hp = b[slot_of[s][r]], h[slot_of[s][r]]
                prop = x[s][r] + hp * xi[s, r]
                log_alpha = -bp * U(prop[None])[0] + bp * U(x[s][r][None])[0]
                if math.log(u[s, r]) < log_alpha:
                    x[s][r] = prop
        if scheme == "adj":
            phases = [[p] for p in range(P - 1)]
        elif scheme == "deo":
            phases = [[p for p in range(P - 1) if p % 2 == k % 2]]
        elif scheme == "seo":
            coin = rng.iteration_uniform((R, 1), seed, rng.Stream.SCHEME, k) < 0.5
            phases = None
        for s in range(R):
            if scheme == "seo":
                odd = bool(coin[s, 0])
                sphases = [[p for p in range(P - 1) if (p % 2 == 1) == odd]]
            else:
                sphases = phases
            for ph, pairs in enumerate(sphases):
                n_cols = P - 1 if scheme != "adj" else 1
                us = rng.iteration_uniform((R, n_cols), seed, rng.Stream.SWAP, k, ph)
                for p in pairs:
                    ra, rb = slot_of[s].index(p), slot_of[s].index(p + 1)
                    ua = us[s, p] if scheme != "adj" else us[s, 0]
                    lr = (b[p] - b[p + 1]) * (U(x[s][ra][None])[0] - U(x[s][rb][None])[0])
                    if math.log(ua) < lr:
                        slot_of[s][ra], slot_of[s][rb] = p + 1, p
        history.append([row[:] for row in slot_of])
    return torch.stack([torch.stack(row) for row in x]), np.array(history)


@pytest.mark.parametrize("scheme", ["deo", "seo", "adj"])
def test_batched_engine_matches_reference_loop(scheme):
    K = 60
    factory = lambda: make_engine(scheme)  # noqa: E731
    x_ref, idx_ref = reference_run(factory, scheme, K)
    eng = factory()
    hist = []
    for _ in range(K):
        eng.step()
        hist.append(eng.slot_of.clone().numpy())
    np.testing.assert_array_equal(np.array(hist), idx_ref)
    torch.testing.assert_close(eng.state.x, x_ref, rtol=1e-12, atol=1e-12)
    assert (np.array(hist) != np.arange(4)).any(), "no swap happened: the test would be vacuous"


# ---------------------------------------------------------------- round trips, always accept
def run_recorded(eng, K):
    """``K`` iterations through the one run loop with the round-trip and swap recorders
    attached (counters are recorders, not engine fields); returns the recorders."""
    recs = {"round_trips": RoundTrips(eng.slot_of, eng.P), "swaps": SwapStats(eng.R, eng.P)}
    outcome = execute(Run(eng, [], recs, Plan.fixed(K)))
    assert not outcome.interrupted and eng.k == K
    return recs


def _counts(recs):
    c = recs["round_trips"].counts()
    return int(c["restarts"].sum()), int(c["round_trips"].sum()), int(c["round_trips_a5"].sum())


def test_round_trips_exact_with_always_accept_deo():
    # With every swap executed, DEO moves each replica one slot per iteration, bouncing at the
    # ends with period 2P.  For P = 4, K = 80, one system, the counts derived by hand in
    # tests/test_diagnostics.py are 39 restarts, 37 Syed round trips, 40 A.5 round trips.
    eng = make_engine("deo", R=1, rule=AlwaysAccept())
    recs = run_recorded(eng, 80)
    assert _counts(recs) == (39, 37, 40)
    # every replica completes one A.5 round trip per 2P = 8 iterations: 80 / 8 = 10 each
    per_replica = recs["round_trips"].tracker.per_replica()
    assert per_replica["round_trips_a5"].tolist() == [[10, 10, 10, 10]]
    # and every proposed swap was executed: DEO proposes each pair every other iteration
    assert recs["swaps"].swaps.tolist() == [[40, 40, 40]]
    assert recs["swaps"].attempts.tolist() == [[40, 40, 40]]


@pytest.mark.parametrize("window", [2, 3])
def test_round_trips_exact_with_always_accept_deo_w(window):
    # A window of W iterations acts like one DEO iteration (one swap per pair, then the gate
    # closes), so K = 80 W iterations give the same counts as 80 DEO iterations.
    eng = make_engine("deo-w", window=window, R=1, rule=AlwaysAccept())
    assert _counts(run_recorded(eng, 80 * window)) == (39, 37, 40)


def test_lemma1_matches_always_accept_round_trip_time():
    # r = 0: Lemma 1 gives E[T] = 2 W P; observed A.5 rate is P / (2 W P) per iteration
    for W in (1, 2, 4):
        eng = make_engine("deo-w", window=W, R=1, rule=AlwaysAccept())
        K = 2 * 4 * W * 25
        a5 = _counts(run_recorded(eng, K))[2]
        assert a5 == K * 4 // nrpt.diagnostics.theory.lemma1_round_trip_time([0.0] * 3, W)


# ---------------------------------------------------------------- DEO_W guarantees
@pytest.mark.parametrize("W", [1, 2, 5])
def test_deo_w_at_most_one_swap_per_pair_per_window_and_parity(W):
    eng = make_engine("deo-w", window=W, R=3, temps=(1.0, 1.3, 1.7, 2.2, 3.0, 4.0))
    P = eng.P
    swaps = SwapStats(eng.R, P)  # executed swaps per pair, fed one iteration at a time
    swaps_in_window = torch.zeros(3, P - 1, dtype=torch.int64)
    prev = swaps.swaps.clone()
    total = 0
    for k in range(40 * W):
        if k % W == 0:
            swaps_in_window.zero_()
        it = eng.step()
        assert it.k == k
        swaps.record(it)
        new = swaps.swaps - prev
        prev = swaps.swaps.clone()
        parity = (k // W) % 2
        wrong_parity = torch.arange(P - 1) % 2 != parity
        assert int(new[:, wrong_parity].sum()) == 0
        swaps_in_window += new
        assert int(swaps_in_window.max()) <= 1
        total += int(new.sum())
    assert total > 20  # swaps did happen


def test_deo_w_window_one_is_deo_bitwise():
    a, b = make_engine("deo"), make_engine("deo-w", window=1)
    for _ in range(50):
        a.step()
        b.step()
    assert torch.equal(a.slot_of, b.slot_of) and torch.equal(a.state.x, b.state.x)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chains=1), "chains must be an integer >= 2"),
        (dict(temperatures=[1.0, 3.0, 2.0], chains=3), "strictly increasing"),
        (dict(temperatures=[2.0, 3.0], chains=2), r"temperatures\[0\] must be 1"),
        (dict(scheme="deo-w", window=0), "window must be an integer >= 1"),
        (dict(step_size=0.0), "step_size must be a finite number > 0"),
        (dict(step_size=-1.0), "step_size must be a finite number > 0"),
        (dict(scheme="bogus"), "scheme must be one of"),
        (dict(explorer="gibbs"), "explorer must be one of"),
        (dict(scheme="seo", window=4),
         r"window does not apply to this exact run .*window is for scheme 'deo-w'"),
    ],
)
def test_bad_configuration_is_rejected_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nrpt.sample("twenty-five-modes", iterations=5, **kwargs)


def test_bad_path_and_engine_arguments():
    with pytest.raises(ValueError, match="at least 2 slots"):
        nrpt.TemperatureLadder([1.0])
    with pytest.raises(ValueError, match="strictly decreasing"):
        nrpt.GeometricPath([1.0, 0.2, 0.5, 0.0])
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        nrpt.DEOW(0)
    with pytest.raises(ValueError, match="step_size must be > 0"):
        make_engine(step=-0.1)


def test_target_with_wrong_output_shape_is_rejected():
    class Wrong:
        dim = 2

        def energy(self, x):
            return (x**2).sum(-1, keepdim=True)  # [n, 1] instead of [n]

    with pytest.raises(ValueError, match=r"shape \[n\]"):
        nrpt.sample(Wrong(), iterations=5)


# ---------------------------------------------------------------- non-finite targets
class HalfLine:
    """Standard normal restricted to x > 0: energy +inf (or NaN) outside the support."""

    dim = 1
    name = "half-normal"

    def __init__(self, bad=math.inf):
        self.bad = bad

    def energy(self, x):
        e = 0.5 * x[:, 0] ** 2
        return torch.where(x[:, 0] > 0, e, torch.full_like(e, self.bad))

    def initial_states(self, n, generator):
        return torch.rand(n, 1, generator=generator, dtype=torch.float64) + 0.5


# +inf with every explorer and NaN with RWMH in the default run; NaN with the gradient
# explorers (the same rejection path, 6 s) in the slow one
@pytest.mark.parametrize("bad, explorer", [
    (math.inf, "rwmh"), (math.inf, "mala"), (math.inf, "hmc"), (math.nan, "rwmh"),
    pytest.param(math.nan, "mala", marks=pytest.mark.slow),
    pytest.param(math.nan, "hmc", marks=pytest.mark.slow)])
def test_nonfinite_proposals_are_rejected_counted_and_reported(bad, explorer):
    extra = {"leapfrog_steps": 3} if explorer == "hmc" else {}  # only HMC takes it
    res = nrpt.sample(HalfLine(bad), chains=4, iterations=3000, step_size=0.8, max_temperature=4,
                      explorer=explorer, seed=1, **extra)
    assert np.isfinite(res.samples).all() and (res.samples > 0).all()
    assert res.nonfinite_proposals > 0
    assert all(a is not None and 0.0 <= a <= 1.0 for a in res.swap_acceptance)
    # half-normal mean sqrt(2/pi) = 0.798, sd 0.603; loose 5-sigma band with ESS >= 150
    assert abs(res.samples.mean() - math.sqrt(2 / math.pi)) < 5 * 0.603 / math.sqrt(150)


# ---------------------------------------------------------------- reproducibility and resume
def test_same_seed_same_run_bitwise_and_different_seed_differs():
    a = nrpt.sample("twenty-five-modes", iterations=300, seed=5)
    b = nrpt.sample("twenty-five-modes", iterations=300, seed=5)
    c = nrpt.sample("twenty-five-modes", iterations=300, seed=6)
    assert np.array_equal(a.samples, b.samples) and np.array_equal(a.index, b.index)
    assert not np.array_equal(a.samples, c.samples)


def test_systems_are_independent_copies_with_their_own_noise():
    res = nrpt.sample("twenty-five-modes", iterations=200, systems=3, seed=2)
    assert res.samples.shape == (3, 180, 2) and res.index.shape == (201, 3, 10)  # burn-in 20
    assert not np.array_equal(res.samples[0], res.samples[1])
    assert isinstance(res.round_trips, list) and len(res.round_trips) == 3


def test_interrupted_run_resumes_bit_for_bit(tmp_path):
    # DEO_W's gates live in the checkpoint too; swap_rule 'always' (verdicts that ignore the
    # states) because a window > 1 with exact Metropolis swaps is refused (biased)
    full = nrpt.sample("twenty-five-modes", iterations=1200, seed=9, scheme="deo-w", window=3,
                       swap_rule="always", out=str(tmp_path / "full"), checkpoint_every=250,
                       figures=False)

    def interrupt(engine):
        if engine.k >= 700:
            raise KeyboardInterrupt

    from nrpt.run.api import run_config
    from nrpt.run.config import RunConfig

    cfg = RunConfig(iterations=1200, seed=9, scheme="deo-w", window=3, swap_rule="always",
                    out=str(tmp_path / "cut"), checkpoint_every=250, figures=False)
    part = run_config(cfg, callback=interrupt)
    assert part.summary["interrupted"] and part.summary["n_iterations"] < 1200
    resumed = nrpt.resume(tmp_path / "cut")
    assert resumed.summary["n_iterations"] == 1200
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert resumed.summary["round_trips"] == full.summary["round_trips"]
    on_disk = np.load(tmp_path / "cut" / "samples.npy")  # every row, the burn-in's first
    assert on_disk.shape[0] == 1200 and np.array_equal(on_disk[120:], full.samples)


def test_supplied_gradient_is_used_and_matches_autograd():
    class WithGrad(Quartic):
        calls = 0

        def grad_energy(self, x):
            WithGrad.calls += 1
            return (x**2 - 4.0) * x

    a = make_engine(explorer="mala", target=WithGrad())
    b = make_engine(explorer="mala", target=Quartic())
    for _ in range(30):
        a.step()
        b.step()
    assert WithGrad.calls > 0
    torch.testing.assert_close(a.state.x, b.state.x, rtol=1e-10, atol=1e-10)
    assert torch.equal(a.slot_of, b.slot_of)


# ---------------------------------------------------------------- the gradient cache (MALA, HMC)
class CountingQuartic(Quartic):
    """Quartic with a supplied gradient that counts the states it is evaluated at."""

    def __init__(self):
        self.rows = 0

    def grad_energy(self, x):
        self.rows += x.shape[0]
        return (x**2 - 4.0) * x


class CountingAutograd(Quartic):
    """Quartic without a supplied gradient: counts the states of the forward passes made for
    autograd (inputs that require grad)."""

    def __init__(self):
        self.rows = 0

    def energy(self, x):
        if x.requires_grad:
            self.rows += x.shape[0]
        return super().energy(x)


class CountingGeometric:
    """A 1-D geometric-form target, N(0, 3^2) reference times a Gaussian likelihood, with
    supplied gradients that count the states they are evaluated at (both are evaluated
    together, so one count per state)."""

    dim = 1
    name = "counting-geometric"

    def __init__(self):
        self.rows = 0

    def log_likelihood(self, x):
        return -2.0 * (x[:, 0] - 1.0) ** 2

    def reference_log_prob(self, x):
        return -0.5 * (x[:, 0] / 3.0) ** 2

    def reference_sample(self, n, generator):
        return 3.0 * torch.randn(n, 1, generator=generator, dtype=torch.float64)

    def grad_log_likelihood(self, x):
        self.rows += x.shape[0]
        return -4.0 * (x - 1.0)

    def grad_reference_log_prob(self, x):
        return -x / 9.0


@pytest.mark.parametrize("explorer,per_step", [("rwmh", 0), ("slice", 0), ("mala", 1),
                                               ("hmc", 3)])
@pytest.mark.parametrize("target", [CountingQuartic, CountingAutograd])
def test_gradient_evaluations_per_step(explorer, per_step, target):
    # The cache is filled once at init (engine -> explorer.prepare); after that MALA evaluates
    # one gradient per replica per step (at the proposal) and HMC one per leapfrog step.
    t = target()
    R, P, K = 2, 4, 25
    ex = HMC(leapfrog_steps=3) if explorer == "hmc" else nrpt.make_explorer(explorer)
    eng = nrpt.PTEngine(t, nrpt.TemperatureLadder([1.0, 2.0, 4.0, 8.0]), ex,
                        nrpt.make_scheme("deo", 1), make_rule("metropolis"), step_size=0.5,
                        systems=R, seed=4)
    at_init = R * P if per_step else 0
    assert t.rows == at_init
    for _ in range(K):
        eng.step()
    assert t.rows == at_init + K * R * P * per_step
    assert (eng.slot_of != torch.arange(P)).any()  # replicas changed slot: the cache moved along


@pytest.mark.parametrize("explorer,per_step", [("mala", 1), ("hmc", 3)])
def test_reference_refresh_prepares_the_fresh_draws(explorer, per_step):
    # On a geometric path the reference slot gets a fresh iid draw every iteration; the engine
    # fills its gradient cache (one gradient per system) so no stale gradient is ever used.
    t = CountingGeometric()
    R, P, K = 3, 4, 20
    ex = HMC(leapfrog_steps=3) if explorer == "hmc" else MALA()
    eng = nrpt.PTEngine(t, nrpt.GeometricPath([1.0, 0.6, 0.3, 0.0]), ex,
                        nrpt.make_scheme("deo", 1), make_rule("metropolis"), step_size=0.4,
                        systems=R, seed=2)
    assert t.rows == R * P
    for _ in range(K):
        eng.step()
    # the reference draws are made a block of iterations at a time (nrpt.rng) and evaluated
    # and prepared REFERENCE_ROWS iterations at a time, as the iterations reach them
    E = min(nrpt.rng.block_length(R * t.dim), nrpt.PTEngine.REFERENCE_ROWS)
    parts = -(-K // E)
    assert t.rows == R * P + K * R * P * per_step + parts * E * R
    # every cached gradient describes its replica's current state
    torch.testing.assert_close(eng.state.extras["grad_v"], 4.0 * (eng.state.x - 1.0))
    torch.testing.assert_close(eng.state.extras["grad_base"], -eng.state.x / 9.0)


class UncachedMALA(Explorer):
    """The textbook MALA step: both gradients recomputed at the slot's b every step (two
    gradient evaluations), no state in ``extras``."""

    name = "mala-uncached"
    uses_gradient = True

    def step(self, state, b, step_size, density, noise, sub=0):
        h = step_size[..., None]
        _, _, g = density.with_grad(state.x, b)
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + 0.5 * h * h * g + h * xi
        v, base, g_new = density.with_grad(x_new, b)
        prop = ReplicaState(x_new, v, base)
        fwd = ((x_new - state.x - 0.5 * h * h * g) ** 2).sum(-1)
        bwd = ((state.x - x_new - 0.5 * h * h * g_new) ** 2).sum(-1)
        log_a = prop.log_density(b) - state.log_density(b) + (fwd - bwd) / (2.0 * step_size**2)
        ok = torch.isfinite(log_a)
        return metropolis_select(state, prop, log_a, ok, noise, sub)


class UncachedHMC(HMC):
    """The textbook HMC step: the initial gradient recomputed at the slot's b every step."""

    name = "hmc-uncached"

    def prepare(self, state, density):
        return state

    def step(self, state, b, step_size, density, noise, sub=0):
        fresh = HMC.prepare(self, ReplicaState(state.x, state.v, state.base), density)
        new, info = super().step(fresh, b, step_size, density, noise, sub)
        return ReplicaState(new.x, new.v, new.base), info  # keep nothing between steps


class ForgetfulMALA(MALA):
    """Negative control: fills its cache at init only, not for the fresh reference draws."""

    def __init__(self):
        self.prepared = 0

    def prepare(self, state, density):
        self.prepared += 1
        return super().prepare(state, density) if self.prepared == 1 else state


def _geometric_engine(explorer, seed=6):
    return nrpt.PTEngine(CountingGeometric(), nrpt.GeometricPath([1.0, 0.6, 0.3, 0.0]),
                         explorer, nrpt.make_scheme("deo", 1), make_rule("metropolis"),
                         step_size=[0.5, 0.7, 1.0, 1.5], systems=3, seed=seed)


@pytest.mark.parametrize("kind", ["mala", "hmc"])
@pytest.mark.parametrize("path", ["temperature", "geometric"])
def test_gradient_cache_gives_the_uncached_trajectory(kind, path):
    # The cached step (gradient at x from the cache, combined at the replica's current b) must
    # make exactly the moves of the textbook step, through swaps (a replica's b changes) and
    # reference refreshes (states replaced from outside the explorer).
    cached = MALA() if kind == "mala" else HMC(leapfrog_steps=3)
    plain = UncachedMALA() if kind == "mala" else UncachedHMC(leapfrog_steps=3)
    if path == "geometric":
        a, b = _geometric_engine(cached), _geometric_engine(plain)
    else:
        a, b = make_engine(explorer=cached, R=3), make_engine(explorer=plain, R=3)
    for _ in range(60):
        a.step()
        b.step()
        assert torch.equal(a.slot_of, b.slot_of)
    torch.testing.assert_close(a.state.x, b.state.x, rtol=1e-10, atol=1e-10)
    assert (a.slot_of != torch.arange(a.P)).any()


def test_negative_control_stale_cache_after_reference_refresh_is_caught():
    # If the fresh reference draws kept the gradient of the replica they replace, the same
    # comparison fails: the test above would catch an engine that forgot to prepare them.
    a, b = _geometric_engine(ForgetfulMALA()), _geometric_engine(UncachedMALA())
    for _ in range(60):
        a.step()
        b.step()
    assert not torch.allclose(a.state.x, b.state.x, rtol=1e-6, atol=1e-6)


def test_releasing_inference_tensors_leaves_modules_alone():
    """After the loop the inference tensors are copied; a module held by the run (a Comm holds
    torch.distributed) is not walked: reading its attributes woke torch's deprecated
    ``reduce_op``, a FutureWarning per process of every `nrpt run --nproc N` (an error here)."""
    import torch.distributed as dist

    from nrpt.core.loop import release_inference_tensors

    class Comm:
        pass

    holder = Comm()
    holder.dist = dist
    with torch.inference_mode():
        holder.x = torch.ones(3)
    release_inference_tensors([holder])
    assert not holder.x.is_inference() and holder.dist is dist


@pytest.mark.parametrize("P", [2, 3, 16, 64, 65, 200])
def test_swap_source_both_ways_and_a_plain_loop(P, monkeypatch):
    """The slot each slot takes its replica from after a phase of disjoint adjacent swaps: the
    integer matrix product (CPU, up to SHIFT_MATRIX_MAX slots) and the padded difference give
    what a Python loop over the pairs gives, on random phases of both parities.  Negative
    control: a phase with one verdict flipped gives another source."""
    import nrpt.core.engine as engine_mod

    g = torch.Generator().manual_seed(P)
    R = 5
    ids = torch.arange(P).expand(R, P)
    for parity in (0, 1):
        acc = (torch.rand(R, P - 1, generator=g) < 0.5) & (torch.arange(P - 1) % 2 == parity)
        want = ids.clone()
        for r in range(R):
            for p in range(P - 1):
                if acc[r, p]:
                    want[r, p], want[r, p + 1] = p + 1, p
        got = engine_mod.swap_source(acc, ids)
        monkeypatch.setattr(engine_mod, "SHIFT_MATRIX_MAX", 0)
        other = engine_mod.swap_source(acc, ids)
        monkeypatch.undo()
        assert torch.equal(got, want) and torch.equal(other, want)
        if parity < P - 1:
            flipped = acc.clone()
            flipped[0, parity] = ~flipped[0, parity]
            assert not torch.equal(engine_mod.swap_source(flipped, ids), want)
