"""Opt-in float32 proposal noise (``noise_dtype = "float32"``, issue 24): off by default, the
same explorers in law.  Each explorer with float32 noise keeps a known Gaussian's moments within
Monte Carlo error (:func:`nrpt.testing.check_invariance`: batch means over 32 chains started from
exact draws, 4.5 standard errors); a negative control whose float32 noise is 20 % too wide for
the correction the step makes fails the same check."""

from __future__ import annotations

import pytest
import torch

import nrpt
from nrpt.explorers import HMC, MALA, RWMH
from nrpt.run.config import RunConfig
from nrpt.targets import Gaussian
from nrpt.testing import check_invariance

#: correlated, unequal scales: sds 1 and 0.5, correlation 0.6
TARGET = Gaussian([0.5, -1.0], [[1.0, 0.3], [0.3, 0.25]])
STEPS = {"rwmh": 0.9, "mala": 0.6, "hmc": 0.25}
MAKE = {"rwmh": RWMH, "mala": MALA, "hmc": lambda noise_dtype: HMC(4, noise_dtype=noise_dtype)}


@pytest.mark.parametrize("name", ["rwmh", "mala", "hmc"])
def test_float32_noise_keeps_the_target(name):
    report = check_invariance(MAKE[name](noise_dtype="float32"), TARGET, step_size=STEPS[name],
                              n_steps=300, systems=32, cross=True, seed=1)
    assert report.ok, report


class _Wide:
    """The iteration's noise with every float32 normal 1.2 x too wide."""

    def __init__(self, noise):
        self.noise = noise

    def normal(self, sub, tail, dtype):
        z = self.noise.normal(sub, tail, dtype)
        return 1.2 * z if dtype == torch.float32 else z

    def __getattr__(self, name):
        return getattr(self.noise, name)


class _WideMALA(MALA):
    def step(self, state, b, step_size, density, noise, sub=0, metric=None):
        return super().step(state, b, step_size, density, _Wide(noise), sub, metric)


def test_the_check_fails_when_the_float32_noise_is_wrong():
    # the negative control: MALA's correction assumes N(0, h^2) noise; 1.2 h biases the chain
    report = check_invariance(_WideMALA(noise_dtype="float32"), TARGET, step_size=STEPS["mala"],
                              n_steps=300, systems=32, cross=True, seed=1)
    assert not report.ok


def test_float32_noise_is_opt_in_and_named_in_errors():
    assert RunConfig().noise_dtype == "float64"
    assert RWMH().describe() == {"name": "rwmh"}  # (the default's description is unchanged)
    assert MALA("float32").describe()["noise_dtype"] == "float32"
    with pytest.raises(ValueError, match="noise_dtype must be one of float64, float32"):
        RunConfig(noise_dtype="float16")
    with pytest.raises(ValueError, match="noise_dtype is for"):
        RunConfig(explorer="slice", noise_dtype="float32")
    a = nrpt.sample("twenty-five-modes", chains=4, iterations=50, explorer="rwmh",
                    figures=False, progress=False, seed=3)
    b = nrpt.sample("twenty-five-modes", chains=4, iterations=50, explorer="rwmh",
                    noise_dtype="float32", figures=False, progress=False, seed=3)
    assert a.samples.dtype == b.samples.dtype == torch.zeros(0, dtype=torch.float64).numpy().dtype
    assert not (a.samples == b.samples).all()  # another random stream, the same dtype
