"""The eager chunk's swap bookkeeping on NumPy views (``Fused._body(U, eager=True)``: float64 on
the CPU, online adaptors allowed, any scheme) gives every number of the traced form's chunk
(``Fused._body(U)``, the tensors' gathers, ``sweep_exchange``) bit for bit: each chunk of a run
is computed both ways from the same carry and inputs and every output and carried tensor
compared with ``torch.equal`` (dtype and shape too).  Negative control: the host form fed the
next iteration's explorer draws differs in the same comparison.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_lean_chunk import _tally  # (a chunk's outputs compared bit for bit)

from nrpt.core import fused as fused_mod
from nrpt.core.loop import execute
from nrpt.run.build import build
from nrpt.run.config import RunConfig
from nrpt.run.sgpt import HEADLINE

CASES = {
    # the headline: SGD, the deterministic rule, C and the learning rates adapted online,
    # DEO_W's gate (a state: the masks per iteration)
    "headline": dict(HEADLINE, chains=6, systems=2),
    # DEO (block_active: every mask per chunk), the adaptors; chunks too large to gather the
    # watched positions per chunk (U R P dim > BLOCK_GATHER)
    "deterministic-deo-u64": dict(HEADLINE, chains=17, systems=8, scheme="deo", fuse=64),
    # no adaptor (the explorer's statistics by slot per chunk), not Metropolis: no lean form
    "deterministic-no-adapt": dict(HEADLINE, chains=4, systems=2, adapt=False),
    # DEO (block_active) on arrays wholly (the host iteration: the scheme's block_after)
    "deterministic-deo": dict(HEADLINE, chains=5, systems=2, scheme="deo"),
    # learning rates so large that some replica's step is not finite in every iteration:
    # the host iteration's fallback (the step's where) and statistics by slot
    "headline-nonfinite": dict(HEADLINE, chains=5, systems=2, lr_max=1e160),
    # an adaptor without an array form (the log-gaps ladder update): the tensor iteration
    "headline-log-gaps": dict(HEADLINE, chains=5, systems=2, ladder_update="log-gaps"),
    # a geometric path (the reference slot refreshed), SEO, two explorer steps an iteration
    "rwmh-seo-reference-n2": dict(target="geometric-bimodal", chains=5, systems=2,
                                  explorer="rwmh", scheme="seo", n_explore=2),
    # a dense preconditioner per slot after the first round (gathered by the slot map)
    "mala-deo-dense-metric": dict(target="twenty-five-modes", chains=5, systems=2,
                                  explorer="mala", scheme="deo", precondition="dense",
                                  rounds=7),
}
#: the cases whose chunks run as the host iteration (Fused._body's host_chunk: every role has
#: an array form, the watched positions gathered per chunk)
ARRAYS = {"headline", "deterministic-no-adapt", "deterministic-deo", "headline-nonfinite"}


def _checked_run(cfg: dict, iterations: int, shift_draws: bool = False) -> tuple[int, list]:
    """Run ``cfg`` fused, every chunk by the eager (host) body and by the traced form's body
    (the host one's result taken); returns (chunks compared, the keys that differed)."""
    run = build(RunConfig.from_dict({}, defaults=dict(cfg, iterations=iterations,
                                                      figures=False,
                                                      fuse=cfg.get("fuse", True))))
    f = run.fused
    assert f is not None
    f._lean_body = lambda U, plain: plain  # (the lean form is tests/test_lean_chunk.py's)
    made = {"host": 0, "gate": 0}
    real = fused_mod._HostSwaps
    instances: list = []

    class Counting(real):
        def __init__(self, *a, **kw):
            made["host"] += 1
            super().__init__(*a, **kw)
            made["gate"] += self.gate is not None
            instances.append(self)

    fused_mod._HostSwaps = Counting
    seen = {"chunks": 0, "differ": []}

    def both(U, compiled):
        host, plain = f._body(U, eager=True), f._body(U)

        def run_both(carry, inp):
            host_inp = inp
            if shift_draws:
                host_inp = dict(inp, draws=[d.roll(1, 0) for d in inp["draws"]])
            new, out = host(carry, host_inp)
            _tally(seen, (new, out), plain(carry, inp))
            return new, out

        return run_both

    f._function = both
    try:
        execute(run)
    finally:
        fused_mod._HostSwaps = real
    assert made["host"] > 0, "the host bookkeeping was not used"
    assert made["gate"] > 0 or cfg.get("scheme") != "deo-w", "DEO_W's gate was not on arrays"
    seen["arrays"] = sum(sw.arrays for sw in instances)
    return seen["chunks"], seen["differ"], seen["arrays"]


@pytest.mark.parametrize("name", list(CASES))
def test_host_swaps_are_the_traced_chunk(name):
    chunks, differ, arrays = _checked_run(CASES[name], 400 if name.endswith("u64") else 150)
    assert chunks >= 3
    assert differ == [], differ
    assert (arrays > 0) == (name in ARRAYS), arrays


def test_host_swaps_comparison_has_power():
    # the host body fed the next iteration's draws: its energies and swaps differ
    _, differ, arrays = _checked_run(CASES["headline"], 100, shift_draws=True)
    assert arrays
    assert any("decision" in k or "accepted" in k for k in differ), differ
    assert any(k.endswith("/v") for k in differ), differ


def test_host_swaps_only_where_they_apply(monkeypatch):
    # float64 CPU chunks up to NUMPY_SWAPS_MAX replicas, eager only
    made = []
    real = fused_mod._HostSwaps
    monkeypatch.setattr(fused_mod, "_HostSwaps",
                        lambda *a, **kw: made.append(True) or real(*a, **kw))
    run = build(RunConfig.from_dict({}, defaults=dict(CASES["headline"], iterations=16,
                                                      figures=False, fuse=True)))
    execute(run)
    made.clear()
    f, k = run.fused, run.engine.k
    with torch.inference_mode():
        f._body(8)(f._carry(), f._inputs(k, 8))
        assert not made
        f._body(8, eager=True)(f._carry(), f._inputs(k, 8))
        assert made
        made.clear()
        monkeypatch.setattr(fused_mod, "NUMPY_SWAPS_MAX", 11)  # (2 systems x 6 chains = 12)
        f._body(8, eager=True)(f._carry(), f._inputs(k, 8))
        assert not made


def _subclassed_run(fuse, swap_class) -> tuple:
    """The headline (6 chains, 2 systems, 96 iterations) with ``swap_class(obj)`` giving each
    adaptor, the rule and the explorer a subclass of its own (or None: as built); the final
    positions, C and learning rates."""
    run = build(RunConfig.from_dict({}, defaults=dict(CASES["headline"], iterations=96,
                                                      figures=False, fuse=fuse)))
    for obj in (*run.adaptors, run.engine.rule, run.engine.explorer):
        cls = swap_class(obj)
        if cls is not None:
            obj.__class__ = cls
    execute(run)
    eng = run.engine
    return eng.state.x.clone(), {n: t.clone() for n, t in eng.params.items()}, \
        eng.step_size.clone()


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(
        torch.equal(a[1][n], b[1][n]) for n in a[1]) and torch.equal(a[2], b[2])


def test_subclass_overrides_are_called_on_every_path():
    # A user's subclass of an adaptor, the rule or the explorer that overrides the method the
    # plain loop calls must be run as it is by the fused chunks too (fuse true / auto), not
    # stood in for by the parent's array forms (own_forms): each run equals the plain loop.
    from nrpt.adapt.sa import CorrectionAdaptor, LearningRateAdaptor
    from nrpt.explorers.sgmcmc import SGD
    from nrpt.roles import Update
    from nrpt.swap.noisy import Deterministic

    class FrozenC(CorrectionAdaptor):  # C never adapted
        def observe(self, it):
            return Update()

        def observe_block(self, it, gain):
            return Update()

    class FixedRates(LearningRateAdaptor):  # the learning rates never adapted
        def observe(self, it):
            return Update()

        def observe_block(self, it, gain):
            return Update()

    class Stricter(Deterministic):  # a swap needs a margin of 0.5 more
        def decide(self, ctx):
            return super().decide(dataclasses.replace(ctx, params={**ctx.params,
                                                       "C": ctx.params["C"] + 0.5}))

    def sub(base):
        class Shrunk(base):  # every proposal's move at 0.9 of the parent's
            def step(self, state, b, step_size, density, noise, sub=0):
                return super().step(state, b, step_size * 0.9, density, noise, sub)
        return Shrunk

    stock = _subclassed_run(False, lambda obj: None)
    # one role subclassed at a time (together, the rule's own decide would switch the host
    # iteration off and hide what the others do)
    for parent, child in ((CorrectionAdaptor, FrozenC), (LearningRateAdaptor, FixedRates),
                          (Deterministic, Stricter), (SGD, sub(SGD))):

        def own(obj, parent=parent, child=child):
            return child if type(obj) is parent else None

        plain = _subclassed_run(False, own)
        assert not _same(plain, stock), child  # (the subclass changes the run: power)
        for fuse in (True, "auto"):
            assert _same(_subclassed_run(fuse, own), plain), (child, fuse)
