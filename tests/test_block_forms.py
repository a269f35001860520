"""The roles' block forms (the fused loop's parts, nrpt.roles / nrpt.swap.schemes) equal their
per-iteration forms: a scheme's block_phase / block_after over a block give the phases and gate
of phases / after_phase iteration by iteration, and an adaptor's observe_block its observe.
Negative controls: a block fed another iteration's inputs differs; a scheme or adaptor without
a block form is not fused, and why_not names it."""

from __future__ import annotations

import pytest
import torch

from nrpt.adapt.sa import CorrectionAdaptor
from nrpt.core.fused import why_not
from nrpt.roles import BLOCK, AdaptorBase
from nrpt.swap.schemes import DEO, DEOW, SEO, Scheme, adjacent_pairs

R, P, SEED = 3, 6, 11


def _plain(scheme, k0, U, accepted):
    state = scheme.init_state(R, P, "cpu")
    systems = torch.arange(R).reshape(R, 1)
    out = []
    for u in range(U):
        k = k0 + u
        (lo, _, active), = scheme.phases(k, R, P, SEED, systems, state)
        out.append(active.clone())
        scheme.after_phase(k, state, lo, accepted[u])
    return out


def _block(scheme, k0, U, accepted, shift=0):
    state = scheme.init_state(R, P, "cpu")
    pairs = adjacent_pairs(R, P, "cpu")
    inputs = scheme.block_inputs(k0 + shift, U, R, SEED, "cpu")
    out = []
    for u in range(U):
        active, state = scheme.block_phase(pairs, inputs, u, state)
        out.append(active)
        state = scheme.block_after(state, accepted[u])
    return out


@pytest.mark.parametrize("scheme", [DEO(), DEOW(3), DEOW(5), SEO()],
                         ids=["deo", "deo-w3", "deo-w5", "seo"])
def test_scheme_block_form_equals_its_phases(scheme):
    g = torch.Generator().manual_seed(0)
    U = 4 * BLOCK
    accepted = torch.rand(U, R, P - 1, generator=g) < 0.4
    plain = _plain(scheme, 0, U, accepted)
    block = _block(scheme, 0, U, accepted)
    assert all(torch.equal(a, b) for a, b in zip(plain, block, strict=True))
    # negative control: the inputs of the block one iteration later
    shifted = _block(scheme, 0, U, accepted, shift=1)
    assert not all(torch.equal(a, b) for a, b in zip(plain, shifted, strict=True))


def test_adaptor_block_form_equals_observe():
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig

    run = build(RunConfig(target="twenty-five-modes", chains=4, systems=2, iterations=3,
                          explorer="rwmh", scheme="deo", figures=False))
    it = run.engine.step()
    it.params = {**it.params, "C": torch.zeros(2, 1, dtype=torch.float64)}
    a = CorrectionAdaptor(0.4)
    x = torch.tensor(a.block_inputs(it.k, 1)[0], dtype=torch.float64)
    assert torch.equal(a.observe(it).params["C"], a.observe_block(it, x).params["C"])
    other = torch.tensor(a.block_inputs(it.k + 100, 1)[0], dtype=torch.float64)
    assert not torch.equal(a.observe(it).params["C"], a.observe_block(it, other).params["C"])


def test_roles_without_a_block_form_are_not_fused():
    from nrpt.run.build import build
    from nrpt.run.config import RunConfig

    class Plain(Scheme):
        name = "plain-dummy"

        def phases(self, k, R, P, seed, systems, state):
            lo, hi, even, _ = adjacent_pairs(R, P, systems.device)
            return [(lo, hi, even)]

    class Online(AdaptorBase):
        name = "online-dummy"

        def observe(self, it):
            return None

    run = build(RunConfig(target="twenty-five-modes", chains=4, systems=2, iterations=16,
                          explorer="rwmh", scheme="deo", figures=False))
    assert why_not(run) is None
    run.adaptors.append(Online())
    assert "online-dummy" in why_not(run) and "observe_block" in why_not(run)
    run.adaptors.pop()
    run.engine.set_scheme(Plain())
    assert "plain-dummy" in why_not(run) and "block form" in why_not(run)
