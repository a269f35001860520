"""Extension by objects (issue 22, items 1 and 4): an explorer with an option and its own
tuning, a scheme with its own predictions, a rule, an adaptor and a recorder, each defined only
here and used through ``nrpt.sample`` -- no file of the package touched.  Each does something
checked; the explorer is checked for invariance with :mod:`nrpt.testing`; negative controls show
that the checks can fail (an explorer that cannot tune itself refuses ``adapt_step_size``; a
kernel that always accepts fails the invariance check)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nrpt
from nrpt.explorers import Explorer, ReplicaState
from nrpt.explorers.metropolis import metropolis_select
from nrpt.roles import AdaptorBase, RecorderBase, Update
from nrpt.run import registry
from nrpt.swap.rules import Rule
from nrpt.swap.schemes import Scheme, adjacent_pairs
from nrpt.targets import Gaussian
from nrpt.testing import check_invariance

SMALL = dict(chains=4, seed=3, figures=False, progress=False)


class ScaledRW(Explorer):
    """Random-walk Metropolis with proposal sd ``scale * step_size`` (its option)."""

    name = "test-scaled-rw"

    def __init__(self, scale: float = 1.0):
        self.scale = float(scale)

    def step(self, state, b, step_size, density, noise, sub=0):
        xi = noise.normal(sub, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + (step_size * self.scale)[..., None] * xi
        v, base = density(x_new)
        prop = ReplicaState(x_new, v, base)
        lp = prop.log_density(b)
        return metropolis_select(state, prop, lp - state.log_density(b), torch.isfinite(lp),
                                 noise, sub)


class AlwaysAcceptRW(ScaledRW):
    """Negative control: every proposal accepted (not invariant)."""

    name = "test-always-accept-rw"

    def step(self, state, b, step_size, density, noise, sub=0):
        new, info = super().step(state, b, step_size, density, noise, sub)
        xi = noise.normal(sub + 1, (state.x.shape[-1],), state.x.dtype)
        x_new = state.x + (step_size * self.scale)[..., None] * xi
        v, base = density(x_new)
        return ReplicaState(x_new, v, base), info


class Halve(AdaptorBase):
    """The tuning ``HalvingRW`` declares: halve every step between rounds (remembering what it
    saw, to be checked)."""

    name = "test-halve"

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def end_segment(self, view):
        if view.last:
            return None
        self.seen.append(view.step_size.clone())
        return Update(step_size=view.step_size * 0.5)


class HalvingRW(ScaledRW):
    """An explorer with its own between-round adaptation."""

    name = "test-halving-rw"

    def __init__(self, scale: float = 1.0):
        super().__init__(scale)
        self.made: list[Halve] = []

    def step_adaptor(self, target_acceptance=None, *, phase=None, follow=None):
        if phase is not None:
            return None
        self.made.append(Halve())
        return self.made[-1]


@pytest.fixture(autouse=True, scope="module")
def _registered():
    """This module's components in the registry while its tests run (two registered by name;
    objects register themselves through nrpt.sample), and out of it afterwards."""
    registry.register("explorer", "test-halving-rw", HalvingRW, tags=("exact",),
                      options=("step_size",))
    registry.register("explorer", "test-untuned-rw", type("UntunedRW", (ScaledRW,), {
        "name": "test-untuned-rw"}), tags=("exact",), options=("step_size",))
    yield
    for role in ("explorer", "scheme", "rule"):
        for name in [n for n in registry.names(role) if n.startswith("test-")]:
            registry.unregister(role, name)


def test_a_registered_explorer_tunes_itself_between_rounds():
    res = nrpt.sample("gaussian", explorer="test-halving-rw", rounds=4, **SMALL)
    tuned = res.engine.explorer
    assert len(tuned.made) == 1 and len(tuned.made[0].seen) == 3  # rounds 1-3 (not the last)
    seen = tuned.made[0].seen
    for a, b in zip(seen, seen[1:], strict=False):
        torch.testing.assert_close(b, a * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(res.engine.step_size, seen[-1] * 0.5, rtol=0, atol=0)


def test_negative_control_an_explorer_without_tuning_refuses_adapt_step_size():
    # before issue 22 the setting was silently ignored (the run went on with fixed steps)
    with pytest.raises(ValueError, match="adapt_step_size: explorer 'test-untuned-rw' declares "
                                         "no step-size tuning"):
        nrpt.sample("gaussian", explorer="test-untuned-rw", rounds=3, **SMALL)
    res = nrpt.sample("gaussian", explorer="test-untuned-rw", rounds=3, adapt_step_size=False,
                      **SMALL)
    assert res.summary["n_iterations"] == 2 + 4 + 8


def test_an_explorer_object_is_the_registered_name_it_stands_for():
    # a name is shorthand for the object: rwmh by name, RWMH() and ScaledRW(2) at half the step
    # make the same draws bit for bit (x 2 is exact in floating point)
    kw = dict(iterations=300, burn_in=0, step_size=0.4, fuse=False, **SMALL)
    by_name = nrpt.sample("gaussian", explorer="rwmh", **kw)
    by_object = nrpt.sample("gaussian", explorer=nrpt.explorers.RWMH(), **kw)
    scaled = nrpt.sample("gaussian", explorer=ScaledRW(scale=2.0), **{**kw, "step_size": 0.2})
    np.testing.assert_array_equal(by_name.samples, by_object.samples)
    np.testing.assert_array_equal(by_name.samples, scaled.samples)
    np.testing.assert_array_equal(by_name.index, scaled.index)
    assert scaled.summary["explorer"] == "test-scaled-rw"
    other = nrpt.sample("gaussian", explorer=ScaledRW(scale=3.0), **{**kw, "step_size": 0.2})
    assert not np.array_equal(other.samples, by_name.samples)  # the option is used


CORRELATED = Gaussian(mean=[1.0, -2.0], cov=[[1.0, 0.6], [0.6, 2.0]])


def test_nrpt_testing_checks_a_users_explorer_and_catches_a_wrong_one():
    kw = dict(step_size=0.8, n_steps=300, seed=5)
    assert check_invariance(ScaledRW(scale=1.5), CORRELATED, **kw).ok
    bad = check_invariance(AlwaysAcceptRW(scale=1.5), CORRELATED, **kw)
    assert not bad.ok  # negative control: the check can fail


class EvenPairsOnly(Scheme):
    """Only the even pairs (0,1), (2,3), ... ever swap; no replica crosses between them, so no
    round trip can happen: its predicted rates are 0."""

    name = "test-even-pairs"

    def phases(self, k, R, P, seed, systems, state):
        lo, hi, even, _ = adjacent_pairs(R, P, systems.device)
        return [(lo, hi, even)]

    def predicted_rates(self, rejection, window=1):
        return {"restarts_per_1000": 0.0, "round_trips_a5_per_1000": 0.0}


def test_a_scheme_object_runs_and_its_own_prediction_is_reported():
    res = nrpt.sample("gaussian", scheme=EvenPairsOnly(), iterations=400, **SMALL)
    index = np.asarray(res.index)[:, 0]  # [K + 1, P]: the slot of each replica
    left = np.isin(index, [0, 1])
    assert (left == left[0]).all()  # replicas never cross from slots {0, 1} to {2, 3}
    assert len(np.unique(index[:, 0])) == 2  # ... but the even pairs do swap
    assert res.summary["scheme"] == "test-even-pairs"
    assert res.summary["predicted_restarts_per_1000"] == 0.0
    assert res.summary["restarts_per_1000"] == 0.0  # (what it predicted)


class Never(Rule):
    """Rejects every proposed swap."""

    name = "test-never"
    exact, state_dependent = False, False

    def decide(self, ctx):
        return torch.zeros_like(ctx.v_lo, dtype=torch.bool), torch.zeros_like(ctx.v_lo)


def test_a_rule_object_decides_the_swaps():
    res = nrpt.sample("gaussian", rule=Never(), iterations=200, **SMALL)
    index = np.asarray(res.index)
    assert (index == index[0]).all()  # nobody ever swapped
    assert res.summary["rule"] == "test-never"
    swapped = nrpt.sample("gaussian", iterations=200, **SMALL)
    assert not (np.asarray(swapped.index) == np.asarray(swapped.index)[0]).all()  # control


class Double(AdaptorBase):
    """Doubles every step size at the end of each segment but the last."""

    name = "test-double"

    def end_segment(self, view):
        return None if view.last else Update(step_size=view.step_size * 2.0)


def test_an_adaptor_object_updates_the_run():
    kw = dict(rounds=3, adapt_step_size=False, adapt_schedule=False, **SMALL)
    plain = nrpt.sample("gaussian", **kw)
    doubled = nrpt.sample("gaussian", adaptors=[Double()], **kw)
    torch.testing.assert_close(doubled.engine.step_size, plain.engine.step_size * 4.0,
                               rtol=0, atol=0)


class Counter(RecorderBase):
    """Counts the iterations it saw."""

    name = "counter"

    def __init__(self):
        self.n = 0

    def record(self, it):
        self.n += 1

    def summary(self):
        return {"iterations_seen": self.n}

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]


def test_a_recorder_object_appears_in_the_summary_and_the_run_folder(tmp_path):
    res = nrpt.sample("gaussian", recorders=[Counter()], iterations=250, out=str(tmp_path / "r"),
                      **SMALL)
    assert res.summary["counter"] == {"iterations_seen": 250}
    on_disk = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert on_disk["counter"] == {"iterations_seen": 250}
    # resumed with its objects given again (its checkpointed state restored); without: refused
    with pytest.raises(ValueError, match="given as objects: resume it with the same objects"):
        nrpt.resume(tmp_path / "r", iterations=300, progress=False)
    more = nrpt.resume(tmp_path / "r", iterations=300, recorders=[Counter()], progress=False)
    assert more.summary["counter"] == {"iterations_seen": 300}
    with pytest.raises(ValueError, match="recorder named 'swaps' is already in the run"):
        clash = Counter()
        clash.name = "swaps"
        nrpt.sample("gaussian", recorders=[clash], iterations=10, **SMALL)


def test_compilable_is_declared_by_the_class_whose_step_runs():
    from nrpt.explorers.compiled import compilable

    built_in = {n: registry.entry("explorer", n).load() for n in registry.names("explorer")
                if not n.startswith("test-") and n != "dummy"}
    assert sorted(n for n, c in built_in.items() if c.compilable) == sorted(
        ["rwmh", "mala", "hmc", "sgd", "sgld", "sghmc", "msgd", "psgd", "psgld"])
    assert compilable(nrpt.explorers.RWMH())
    assert not compilable(ScaledRW())  # declares nothing

    class Redefined(nrpt.explorers.RWMH):  # a new step does not inherit the declaration
        def step(self, state, b, step_size, density, noise, sub=0):
            return super().step(state, b, step_size, density, noise, sub)

    assert not compilable(Redefined())
