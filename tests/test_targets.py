"""Tests of the target protocol (nrpt.targets.protocol) and the built-in targets (nrpt.targets).

Statistical checks use fixed seeds and tolerances of ``N_SE = 5`` Monte Carlo standard errors:
for a mean, ``se = sd / sqrt(n)`` with the exact ``sd``; for a covariance entry, ``se`` is the
sample standard deviation of the centred products ``(x_i - m_i)(x_j - m_j)`` over ``sqrt(n)``.
Under a correct sampler each check fails with probability < 1e-6 (per entry); the negative
controls show that the same checks have the power to catch a modest error.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from scipy.special import i0

import nrpt
from nrpt.targets import (
    Gaussian,
    GaussianMixture,
    GaussianReference,
    GeometricTarget,
    TwentyFiveModes,
    bimodal_1d,
    gaussian,
    geometric_bimodal,
    mixture_2d,
)
from nrpt.targets.protocol import (
    BUILTIN_TARGETS,
    TargetError,
    load_target,
    path_kind,
    validate_target,
)

N_SE = 5.0
N_SAMPLES = 200_000


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def moments_match(
    samples: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor, n_se: float = N_SE
) -> bool:
    """True iff the sample mean and covariance of ``samples`` ``[n, d]`` are within ``n_se``
    Monte Carlo standard errors of ``mean`` and ``cov`` in every entry (see module docstring)."""
    x = samples.to(torch.float64)
    n = x.shape[0]
    se_mean = torch.sqrt(torch.diagonal(cov) / n)
    if not bool(((x.mean(0) - mean).abs() <= n_se * se_mean).all()):
        return False
    c = x - mean
    prods = c[:, :, None] * c[:, None, :]  # [n, d, d]; mean is an unbiased estimate of cov
    se_cov = prods.std(dim=0) / math.sqrt(n)
    return bool(((prods.mean(0) - cov).abs() <= n_se * se_cov).all())


def log_target(target, x: torch.Tensor) -> torch.Tensor:
    """log pi(x) up to a constant, for either form of the protocol."""
    if path_kind(target) == "geometric":
        return target.reference_log_prob(x) + target.log_likelihood(x)
    return -target.energy(x)


def grid_integral_1d(log_density, lo: float, hi: float, n: int = 200_001) -> float:
    t = torch.linspace(lo, hi, n, dtype=torch.float64)
    vals = torch.exp(log_density(t[:, None]))
    return float(torch.trapezoid(vals, t))


def grid_integral_2d(log_density, lim: float, h: float) -> float:
    t = torch.arange(-lim, lim + h / 2, h, dtype=torch.float64)
    x = torch.cartesian_prod(t, t)
    return float(torch.exp(log_density(x)).sum()) * h * h


# ---------------------------------------------------------------------------------------------
# (a) exact samplers agree with the exact moments; (g) negative controls
# ---------------------------------------------------------------------------------------------


def correlated_gaussian() -> Gaussian:
    cov = torch.tensor([[2.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 0.5]], dtype=torch.float64)
    return Gaussian(torch.tensor([1.0, -2.0, 0.5]), cov)


@pytest.mark.parametrize(
    "make",
    [correlated_gaussian, bimodal_1d, mixture_2d, lambda: gaussian(dim=3, correlation=0.5)],
    ids=["gaussian-3d", "bimodal", "mixture-2d", "gaussian-builtin"],
)
def test_sample_matches_moments(make):
    target = make()
    x = target.sample(N_SAMPLES, gen(1))
    assert x.shape == (N_SAMPLES, target.dim) and x.dtype == torch.float64
    assert moments_match(x, target.mean, target.cov)


def test_reference_sample_matches_moments():
    ref = GaussianReference(mean=[1.0, -1.0], std=3.0, dim=2)
    assert moments_match(ref.sample(N_SAMPLES, gen(2)), ref.mean, ref.cov)
    geo = geometric_bimodal()
    x = geo.reference_sample(N_SAMPLES, gen(3))
    assert moments_match(x, torch.zeros(1, dtype=torch.float64), torch.full((1, 1), 36.0))


def test_mixture_moments_closed_form():
    t = bimodal_1d()
    # mean 0.3*(-4) + 0.7*4 = 1.6; E x^2 = 1 + 16 = 17; var = 17 - 1.6^2
    assert float(t.mean) == pytest.approx(1.6, abs=1e-14)
    assert float(t.cov) == pytest.approx(17.0 - 1.6**2, abs=1e-12)


def test_negative_control_wrong_weights_fails_moment_check():
    right = bimodal_1d()
    wrong = GaussianMixture([0.32, 0.68], [[-4.0], [4.0]], [1.0, 1.0])
    # the same check accepts the right sampler and rejects one whose weights are off by 0.02
    # (mean off by 0.16, about 19 standard errors at n = 200k)
    assert moments_match(right.sample(N_SAMPLES, gen(4)), right.mean, right.cov)
    assert not moments_match(wrong.sample(N_SAMPLES, gen(4)), right.mean, right.cov)


def test_negative_control_wrong_covariance_fails_moment_check():
    target = correlated_gaussian()
    wrong_cov = target.cov.clone()
    wrong_cov[0, 1] = wrong_cov[1, 0] = 0.5  # true 0.6
    assert not moments_match(target.sample(N_SAMPLES, gen(5)), target.mean, wrong_cov)


def test_sampling_uses_only_the_given_generator():
    state = torch.random.get_rng_state()
    for target in (correlated_gaussian(), mixture_2d(), TwentyFiveModes()):
        a = target.initial_states(5, gen(7))
        b = target.initial_states(5, gen(7))
        assert torch.equal(a, b)
        if hasattr(target, "sample"):
            assert torch.equal(target.sample(5, gen(8)), target.sample(5, gen(8)))
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(TypeError, match="Generator"):
        bimodal_1d().sample(5, None)


# ---------------------------------------------------------------------------------------------
# (b) energies are consistent with the exact normalizers, CDFs and samplers
# ---------------------------------------------------------------------------------------------


def test_gaussian_energy_matches_scipy_logpdf():
    target = correlated_gaussian()
    x = target.sample(50, gen(9))
    ref = stats.multivariate_normal(target.mean.numpy(), target.cov.numpy()).logpdf(x.numpy())
    got = -(target.energy(x) + target.log_normalizer)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(target.log_prob(x).numpy(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "target",
    [
        Gaussian([1.3], [[2.25]]),
        bimodal_1d(),
        GaussianReference(0.5, 2.0, dim=1),
        geometric_bimodal(),
    ],
    ids=["gaussian-1d", "bimodal", "reference", "geometric-bimodal"],
)
def test_normalization_1d(target):
    z = grid_integral_1d(lambda x: log_target(target, x), -40.0, 40.0)
    assert math.log(z) == pytest.approx(getattr(target, "log_normalizer", 0.0), abs=1e-9)


@pytest.mark.parametrize(
    "target",
    [Gaussian([0.5, -1.0], [[1.0, 0.7], [0.7, 2.0]]), mixture_2d()],
    ids=["gaussian-2d", "mixture-2d"],
)
def test_normalization_2d(target):
    z = grid_integral_2d(lambda x: -target.energy(x), lim=12.0, h=0.05)
    assert math.log(z) == pytest.approx(target.log_normalizer, abs=1e-9)


def test_cdf_matches_integral_of_density():
    target = bimodal_1d()
    t = torch.linspace(-15.0, 15.0, 300_001, dtype=torch.float64)
    dens = torch.exp(-target.energy(t[:, None]))
    cum = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumulative_trapezoid(dens, t)])
    idx = torch.arange(0, t.numel(), 5_000)
    np.testing.assert_allclose(target.cdf(t[idx]).numpy(), cum[idx].numpy(), atol=1e-9)
    # the input kind is preserved
    assert isinstance(target.cdf(0.0), float)
    assert isinstance(target.cdf(np.array([0.0, 1.0])), np.ndarray)
    assert isinstance(target.cdf(torch.zeros(2)), torch.Tensor)


def test_marginal_cdf_matches_integral_of_density():
    target = mixture_2d()
    h = 1.0 / 32  # exact in binary, so the cut points below lie exactly on the grid
    grid = torch.arange(-10.0, 10.0 + h / 2, h, dtype=torch.float64)
    dens = torch.exp(-target.energy(torch.cartesian_prod(grid, grid))).reshape(len(grid), -1)
    for dim_index in (0, 1):
        marginal = dens.sum(dim=1 - dim_index) * h
        for cut in (-4.0, -1.0, 0.0, 3.5, 4.0):
            keep = grid <= cut  # Simpson's rule up to the cut (an even number of intervals)
            mass = float(integrate.simpson(marginal[keep].numpy(), x=grid[keep].numpy()))
            assert target.marginal_cdf(cut, dim_index) == pytest.approx(mass, abs=1e-7)
    with pytest.raises(TargetError, match="dim == 1"):
        target.cdf(0.0)


def test_samples_follow_cdf_kolmogorov_smirnov():
    target = bimodal_1d()
    x = target.sample(20_000, gen(10))[:, 0].numpy()
    assert stats.kstest(x, target.cdf).pvalue > 1e-3
    # negative control: samples of the mirrored mixture are rejected
    mirrored = GaussianMixture([0.7, 0.3], [[-4.0], [4.0]], [1.0, 1.0])
    y = mirrored.sample(20_000, gen(10))[:, 0].numpy()
    assert stats.kstest(y, target.cdf).pvalue < 1e-6


def test_geometric_target_decomposition():
    base = bimodal_1d()
    geo = geometric_bimodal()
    assert path_kind(geo) == "geometric" and geo.reference_is_normalized
    assert geo.dim == 1 and geo.name == "geometric-bimodal"
    assert torch.equal(geo.mean, base.mean) and torch.equal(geo.cov, base.cov)
    assert geo.cdf(4.0) == pytest.approx(base.cdf(4.0))
    x = torch.linspace(-10, 10, 41, dtype=torch.float64)[:, None]
    np.testing.assert_allclose(
        (geo.reference_log_prob(x) + geo.log_likelihood(x)).numpy(),
        (-base.energy(x)).numpy(),
        atol=1e-12,
    )
    ref = stats.norm(0.0, 6.0).logpdf(x[:, 0].numpy())
    np.testing.assert_allclose(geo.reference_log_prob(x).numpy(), ref, atol=1e-12)
    with pytest.raises(TargetError, match="dim"):
        GeometricTarget(mixture_2d(), GaussianReference(dim=1))


def test_float32_inputs_stay_float32():
    x = torch.zeros(4, 2, dtype=torch.float32)
    for target in (TwentyFiveModes(True), mixture_2d(), gaussian(dim=2)):
        assert target.energy(x).dtype == torch.float32
    assert geometric_bimodal().log_likelihood(x[:, :1]).dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# (c) twenty-five modes
# ---------------------------------------------------------------------------------------------


def test_twenty_five_local_minima_near_integer_points():
    target = TwentyFiveModes()
    h = 0.005
    t = torch.arange(-2.4, 2.4 + h / 2, h, dtype=torch.float64)
    u = target.energy(torch.cartesian_prod(t, t)).reshape(len(t), len(t))
    inner = u[1:-1, 1:-1]
    is_min = torch.ones_like(inner, dtype=torch.bool)
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if di or dj:
                is_min &= inner < u[1 + di : len(t) - 1 + di, 1 + dj : len(t) - 1 + dj]
    i, j = torch.nonzero(is_min, as_tuple=True)
    minima = torch.stack([t[1:-1][i], t[1:-1][j]], dim=1)
    assert minima.shape[0] == 25
    # each sits within 0.011 + grid spacing of an integer point, and all 25 points are hit
    assert (minima - minima.round()).abs().max() < 0.011 + h
    assert {tuple(p) for p in minima.round().tolist()} == {
        tuple(p) for p in target.mode_centers.tolist()
    }


def test_twenty_five_modes_penalty_only_outside_radius():
    plain, pen = TwentyFiveModes(False), TwentyFiveModes(True)
    x = 7.0 * (2.0 * torch.rand(2_000, 2, generator=gen(11), dtype=torch.float64) - 1.0)
    r2 = (x * x).sum(1)
    diff = pen.energy(x) - plain.energy(x)
    inside = r2 <= 20.0
    assert inside.any() and (~inside).any()
    assert torch.all(diff[inside] == 0.0)
    np.testing.assert_allclose(diff[~inside].numpy(), (r2[~inside] - 20.0).numpy(), atol=1e-12)


def test_twenty_five_modes_normalizer_and_moments():
    plain, pen = TwentyFiveModes(False), TwentyFiveModes(True)
    # without the penalty pi factorizes: Z = (int exp(-0.2 t^2 + 2 cos 2 pi t) dt)^2 and the
    # integral is I0(2) sqrt(5 pi) up to ~e^-49 (the Gaussian's Fourier tail)
    assert plain.log_normalizer == pytest.approx(
        2 * math.log(i0(2.0) * math.sqrt(5 * math.pi)), abs=1e-11
    )
    assert torch.allclose(plain.cov, 2.5 * torch.eye(2, dtype=torch.float64), atol=1e-10)
    # penalized: compare the polar quadrature with a fine Cartesian grid
    z = grid_integral_2d(lambda x: -pen.energy(x), lim=6.5, h=0.01)
    assert pen.log_normalizer == pytest.approx(math.log(z), abs=1e-6)
    assert pen.cov[0, 0] < 2.5 and torch.equal(pen.mean, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("penalty", [False, True])
def test_twenty_five_modes_stored_moments_are_the_quadratures(penalty):
    from nrpt.targets.twenty_five_modes import _polar_moments

    _polar_moments.cache_clear()
    log_z, second = _polar_moments(penalty)  # (libm may differ in the last bits: no equality)
    target = TwentyFiveModes(penalty)
    assert target.log_normalizer == pytest.approx(log_z, rel=1e-12, abs=0)
    assert float(target.cov[0, 0]) == pytest.approx(0.5 * second, rel=1e-12, abs=0)


@pytest.mark.parametrize("penalty", [False, True])
def test_density_grid(penalty):
    target = TwentyFiveModes(penalty)
    xs, ys, probs = target.density_grid()
    assert probs.shape == (len(xs) - 1, len(ys) - 1) and np.all(probs >= 0)
    assert probs.sum() == pytest.approx(1.0, abs=1e-7)  # the box holds all but < 1e-7
    np.testing.assert_allclose(probs, probs.T, atol=1e-15)  # x1 <-> x2 symmetry
    np.testing.assert_allclose(probs, probs[::-1, ::-1], atol=1e-15)  # x -> -x symmetry
    # the cell probabilities agree with a direct integral of the density over one cell
    i = int(np.searchsorted(xs, 0.0)) - 1  # the cell holding the origin
    a, b = xs[i], xs[i + 1]
    h = (b - a) / 400
    t = torch.arange(a + h / 2, b, h, dtype=torch.float64)  # midpoint rule
    cell = torch.exp(-target.energy(torch.cartesian_prod(t, t)) - target.log_normalizer)
    assert probs[i, i] == pytest.approx(float(cell.sum()) * h * h, rel=1e-5)
    # a smaller box loses the mass outside it: [-2.5, 2.5]^2 would miss ~20% without penalty
    _, _, small = target.density_grid(lim=2.5, bins=5)
    assert small.shape == (5, 5)
    outside = 1.0 - small.sum()
    assert 0.15 < outside < 0.25


@pytest.mark.parametrize("bins", [5, 7, 99])
def test_density_grid_in_row_blocks_is_the_one_shot_integral(bins):
    # the penalty's grid is integrated four rows of cells at a time (small temporaries); it
    # is the one-shot 4-D quadrature (to rounding: 1e-14 relative), including a last block
    # of fewer than four rows (bins 5, 7)
    from nrpt.targets.twenty_five_modes import _log_density_np

    target = TwentyFiveModes(True)
    _, _, probs = target.density_grid(lim=5.5, bins=bins)
    edges = np.linspace(-5.5, 5.5, bins + 1)
    h = edges[1] - edges[0]
    u, w = np.polynomial.legendre.leggauss(16)
    pts = edges[:-1, None] + (u[None, :] + 1.0) * (h / 2.0)

    def one_shot(log_z):
        dens = np.exp(_log_density_np(pts[:, :, None, None], pts[None, None], True) - log_z)
        return np.einsum("injm,n,m->ij", dens, w * (h / 2.0), w * (h / 2.0))

    np.testing.assert_allclose(probs, one_shot(target.log_normalizer), rtol=1e-14, atol=0)
    # negative control: log Z off by 1e-12 is seen
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(probs, one_shot(target.log_normalizer + 1e-12), rtol=1e-14,
                                   atol=0)


def test_twenty_five_modes_initial_states_uniform_box():
    x = TwentyFiveModes().initial_states(10_000, gen(12))
    assert x.shape == (10_000, 2) and x.abs().max() <= 1.0
    # uniform on [-1, 1]: mean 0 and variance 1/3 per coordinate
    assert moments_match(x, torch.zeros(2, dtype=torch.float64), torch.eye(2) / 3.0)


# ---------------------------------------------------------------------------------------------
# (d) validate_target and path_kind
# ---------------------------------------------------------------------------------------------


class EnergyTarget:
    def __init__(self, dim=2, out=None):
        self.dim = dim
        self._out = out

    def energy(self, x):
        return self._out(x) if self._out else 0.5 * (x * x).sum(1)


class PartialGeometric:
    dim = 1

    def log_likelihood(self, x):
        return -(x[:, 0] ** 2)

    def reference_log_prob(self, x):
        return -0.5 * x[:, 0] ** 2


def test_validate_accepts_all_builtins_and_returns_kind():
    for name, factory in BUILTIN_TARGETS.items():
        expected = "geometric" if name.startswith("geometric") else "temperature"
        assert validate_target(factory()) == expected
    assert validate_target(TwentyFiveModes(penalty=True)) == "temperature"
    assert validate_target(EnergyTarget()) == "temperature"


def test_validate_missing_members():
    class Nothing:
        dim = 2

    with pytest.raises(TargetError, match="energy") as info:
        validate_target(Nothing())
    assert "log_likelihood" in str(info.value) and "reference_sample" in str(info.value)
    with pytest.raises(TargetError, match="no reference_sample\\(n, generator\\): a geometric"):
        validate_target(PartialGeometric())
    with pytest.raises(TargetError, match="not callable"):
        path_kind(type("T", (), {"dim": 1, "energy": 3.0})())
    with pytest.raises(TargetError, match="dim"):
        validate_target(type("T", (), {"energy": lambda self, x: x[:, 0]})())


def test_validate_wrong_output_shape_names_member():
    target = EnergyTarget(out=lambda x: (x * x).sum(1, keepdim=True))
    with pytest.raises(TargetError) as info:
        validate_target(target)
    msg = str(info.value)
    assert "target.energy(x) must return shape [n] = [3]" in msg and "got [3, 1]" in msg
    with pytest.raises(TargetError, match="torch.Tensor"):
        validate_target(EnergyTarget(out=lambda x: 1.0))
    with pytest.raises(TargetError, match="energy\\(x\\) raised RuntimeError"):
        validate_target(EnergyTarget(dim=3, out=lambda x: x @ torch.ones(2, dtype=x.dtype)))


def test_validate_geometric_shapes():
    class BadSample(PartialGeometric):
        def reference_sample(self, n, generator):
            return torch.randn(n, generator=generator, dtype=torch.float64)

    with pytest.raises(TargetError, match="reference_sample.*\\[3, 1\\].*got \\[3\\]"):
        validate_target(BadSample())

    class BadLik(BadSample):
        def reference_sample(self, n, generator):
            return torch.randn(n, 1, generator=generator, dtype=torch.float64)

        def log_likelihood(self, x):
            return x

    with pytest.raises(TargetError, match="target.log_likelihood\\(x\\) must return shape"):
        validate_target(BadLik())


@pytest.mark.parametrize("dim", [2.0, "2", True, 0, -1, None])
def test_validate_dim_must_be_positive_int(dim):
    with pytest.raises(TargetError, match="target.dim"):
        validate_target(EnergyTarget(dim=dim))


def test_validate_optional_members():
    target = EnergyTarget()
    target.initial_states = lambda n, g: torch.zeros(n, 3)
    with pytest.raises(TargetError, match="initial_states.*\\[3, 2\\].*got \\[3, 3\\]"):
        validate_target(target)
    target = EnergyTarget()
    target.mean = torch.zeros(3)
    with pytest.raises(TargetError, match="target.mean"):
        validate_target(target)
    target = EnergyTarget()
    target.name = 5
    with pytest.raises(TargetError, match="target.name"):
        validate_target(target)


def test_validate_allows_non_finite_values():
    target = EnergyTarget(out=lambda x: torch.where(x[:, 0] > 0, math.inf, 0.0 * x[:, 0]))
    assert validate_target(target) == "temperature"


# ---------------------------------------------------------------------------------------------
# (e) load_target
# ---------------------------------------------------------------------------------------------

USER_FILE = """
import torch

import nrpt

class Quartic:
    def __init__(self, dim=2, scale=1.0):
        self.dim = dim
        self.scale = scale
        self.name = "quartic"

    def energy(self, x):
        return self.scale * (x ** 4).sum(1)

def make_quartic(dim=3):
    return Quartic(dim=dim)

instance = Quartic(dim=4)
not_a_target = 42
"""


def test_load_target_from_file(tmp_path):
    path = tmp_path / "my.py"
    path.write_text(USER_FILE)
    obj = load_target(f"{path}:instance")
    assert obj.dim == 4 and validate_target(obj) == "temperature"
    from_class = load_target(f"{path}:Quartic", dim=5, scale=2.0)
    assert from_class.dim == 5 and from_class.scale == 2.0
    from_function = load_target(f"{path}:make_quartic", dim=6)
    assert from_function.dim == 6 and validate_target(from_function) == "temperature"
    assert load_target(f"{path}:make_quartic").dim == 3
    with pytest.raises(TargetError, match="already a target object"):
        load_target(f"{path}:instance", dim=3)
    with pytest.raises(TargetError, match="no attribute 'missing'"):
        load_target(f"{path}:missing")
    with pytest.raises(TargetError, match="names no attribute"):
        load_target(str(path))
    with pytest.raises(TargetError, match="not found"):
        load_target(f"{tmp_path / 'absent.py'}:instance")
    with pytest.raises(TargetError, match="not a target"):
        validate_target(load_target(f"{path}:not_a_target"))


def test_load_builtin_targets():
    for name in BUILTIN_TARGETS:
        assert validate_target(load_target(name)) in ("temperature", "geometric")
    assert load_target("twenty_five_modes", penalty=True).penalty
    assert load_target("gaussian", dim=4).dim == 4
    with pytest.raises(TargetError) as info:
        load_target("no-such-target")
    msg = str(info.value)
    assert all(name in msg for name in BUILTIN_TARGETS) and "file.py:NAME" in msg
    with pytest.raises(TargetError, match="twenty-five-modes"):
        load_target("twenty-five-modes", no_such_option=1)


# ---------------------------------------------------------------------------------------------
# (f) autograd gradients agree with finite differences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [load_target(name) for name in BUILTIN_TARGETS]
    + [TwentyFiveModes(penalty=True), correlated_gaussian(), GaussianReference(1.0, 2.0, 3)],
    ids=[*BUILTIN_TARGETS, "twenty-five-modes-penalized", "gaussian-3d", "reference"],
)
def test_gradient_matches_finite_differences(target):
    g = gen(13)
    # points spread over the bulk (radius up to ~6, beyond the penalty's kink at sqrt(20))
    x = 3.0 * torch.randn(8, target.dim, generator=g, dtype=torch.float64)

    def f(z):
        return -log_target(target, z)  # the energy along the path's end point

    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(xg).sum(), xg)
    eps = 1e-6
    fd = torch.empty_like(x)
    for k in range(target.dim):
        e = torch.zeros_like(x)
        e[:, k] = eps
        fd[:, k] = (f(x + e) - f(x - e)) / (2 * eps)
    np.testing.assert_allclose(grad.numpy(), fd.numpy(), rtol=1e-6, atol=1e-6)


def test_logsumexp_equals_torch_bit_for_bit():
    """nrpt.targets.logsumexp floors exponents far below the maximum (torch's exp is slow on
    underflowing arguments); the value is torch.logsumexp's, also on non-finite rows."""
    from nrpt.targets import logsumexp

    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 30.0, 1250.0, 1e6):
        z = -scale * torch.rand(300, 25, dtype=torch.float64, generator=g)
        assert torch.equal(logsumexp(z), torch.logsumexp(z, dim=-1)), scale
    z32 = -900.0 * torch.rand(50, 7, dtype=torch.float32, generator=g)
    assert torch.equal(logsumexp(z32), torch.logsumexp(z32, dim=-1))
    inf, nan = math.inf, math.nan
    rows = torch.tensor([[-inf, -inf, -inf], [inf, 1.0, 2.0], [nan, 1.0, 2.0],
                         [-inf, 0.0, -2000.0], [1e308, 1e308, -1e308],
                         [-1e308, -1e308, -1e308]], dtype=torch.float64)
    torch.testing.assert_close(logsumexp(rows), torch.logsumexp(rows, dim=-1), rtol=0, atol=0,
                               equal_nan=True)
    # gradients are torch's (a z that requires one goes to torch.logsumexp itself)
    zg = (-30.0 * torch.rand(8, 25, dtype=torch.float64, generator=g)).requires_grad_()
    (ga,) = torch.autograd.grad(logsumexp(zg).sum(), zg)
    (gb,) = torch.autograd.grad(torch.logsumexp(zg, -1).sum(), zg)
    assert torch.equal(ga, gb)
    assert torch.equal(logsumexp(torch.zeros(3, 0)), torch.logsumexp(torch.zeros(3, 0), -1))
    # (the test can fail: a floor inside the range that matters changes the value)
    near = torch.tensor([[0.0, -3.0, -5.0]], dtype=torch.float64)
    assert not torch.equal(torch.logsumexp(near.clamp_min(-4.0), -1),
                           torch.logsumexp(near, -1))


def test_sum_last_equals_sum():
    from nrpt.targets import sum_last

    g = torch.Generator().manual_seed(1)
    for k in (1, 2, 3, 4, 9):
        t = torch.randn(64, 5, k, dtype=torch.float64, generator=g)
        torch.testing.assert_close(sum_last(t), t.sum(-1), rtol=1e-15, atol=0)
    t = torch.randn(64, 2, dtype=torch.float64, generator=g)
    assert torch.equal(sum_last(t), t.sum(-1))  # two entries: one rounded addition
    assert sum_last(torch.zeros(3, 0)).shape == (3,)


# --------------------------------------------------------------------------- optional members
def test_every_target_member_nrpt_probes_is_declared():
    """Every member of a target that nrpt looks up by name is required or in OPTIONAL_MEMBERS
    (the one declaration of the protocol's optional part)."""
    import pathlib
    import re

    import nrpt
    from nrpt.targets.protocol import OPTIONAL_MEMBERS

    required = {"dim", "energy", "log_likelihood", "reference_log_prob", "reference_sample"}
    probe = re.compile(r'(?:(?:hasattr|getattr|optional_value)\((?:self\.)?(?:target|t), '
                       r'|\.has\()["\'](\w+)["\']')
    found = {m for f in pathlib.Path(nrpt.__file__).parent.rglob("*.py")
             for m in probe.findall(f.read_text())}
    assert {"initial_states", "mean", "name", "sample_at"} <= found  # the scan sees the probes
    assert found - required - set(OPTIONAL_MEMBERS) == set()
    # negative control: a probe of an undeclared member is caught by the same scan
    assert probe.findall('getattr(target, "no_such_member", None)') == ["no_such_member"]
    assert "no_such_member" not in OPTIONAL_MEMBERS


def test_capabilities_are_found_once_from_the_declaration():
    from nrpt.targets.protocol import Capabilities, capabilities

    class Plain:
        dim = 1
        name = None

        def energy(self, x):
            return (x * x).sum(1)

    class Supplied(Plain):
        name = "supplied"
        analytic_gradients = True
        initial_states = None  # not callable: not a capability

        def energy_and_grad(self, x):
            return self.energy(x), 2 * x

    class HalfGeometric:
        dim = 1

        def grad_log_likelihood(self, x):
            return x

    plain, supplied = capabilities(Plain()), capabilities(Supplied())
    assert isinstance(plain, Capabilities) and plain.name == "Plain"
    assert plain.methods == frozenset() and plain.supplied_gradients("temperature") == ()
    assert supplied.name == "supplied" and supplied.analytic_gradients
    assert supplied.has("energy_and_grad") and not supplied.has("initial_states")
    assert supplied.supplied_gradients("temperature") == ("energy_and_grad",)
    assert capabilities(HalfGeometric()).supplied_gradients("geometric") == ()
    with pytest.raises(KeyError, match="not an optional method"):
        supplied.has("mean")  # a value, not a method


def test_optional_values_are_read_through_the_declaration():
    from nrpt.targets.protocol import optional_value

    class T:
        dim = 1
        name = None
        mean = torch.zeros(1)

    assert optional_value(T(), "mean") is T.mean and optional_value(T(), "cov") is None
    assert optional_value(T(), "name", "default") is None  # present (None) beats the default
    assert optional_value(T(), "coordinate_names", "default") == "default"
    with pytest.raises(KeyError, match="not an optional member"):
        optional_value(T(), "mena")  # negative control: a misspelt probe fails loudly


def test_a_target_named_none_is_labelled_by_its_class_not_the_default_target():
    """A user target with ``name = None`` was reported as the default built-in
    (``twenty-five-modes``) in the summary; it is labelled by its class name.  Control: a str
    name is kept."""

    class Unnamed:
        name = None
        dim = 1

        def energy(self, x):
            return 0.5 * (x ** 2).sum(-1)

    class Named(Unnamed):
        name = "my-model"

    for target, label in ((Unnamed(), "Unnamed"), (Named(), "my-model")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = nrpt.sample(target, iterations=60, chains=3, burn_in=0, figures=False)
        assert res.summary["target"] == label
