r"""A Gaussian reference for density-only targets (``energy(x)`` alone: a Stan program, a
flat-prior model), one leg, no prior.

A :class:`~nrpt.targets.protocol.TemperatureForm` target has no separable prior to anneal from,
and its temperature path's hot end ``exp(-U / tau)`` may be improper (flat priors).  This path
anneals instead from a normalized Gaussian ``q = N(m, S)``::

    log pi_beta = (1 - beta) log q + beta (-U),    beta_0 = 1 > ... > beta_{P-1} = 0

split as ``log pi_p = base - b_p V`` with ``base = log q`` and ``V = U + log q``; slot ``P - 1``
is ``q`` itself, sampled exactly every iteration.  ``q`` is normalized, so the stepping-stone
estimate is ``log Z`` of ``exp(-U)`` itself.

``reference = "gaussian"``: ``q`` is refitted between adaptive rounds to the round's slot-0
draws by moment matching (:func:`nrpt.paths.variational.fit_gaussian`: full-rank up to
:data:`FULL_RANK_MAX_DIM` dimensions, mean-field above), through the same
``Update.reference`` channel as the two-leg variational reference.  Guards against fitting
``q`` to a slot 0 that never mixed (the failure mode of issue 25):

* with ``systems >= 2`` one ``q`` is fitted to the slot-0 draws of *all* systems, its
  covariance including the spread *between* the systems' means: systems stuck in different
  places widen ``q`` to cover all of them instead of each narrowing onto its own spot;
* ``q`` is refitted only to a round of at least :data:`MIN_DRAWS` pooled draws in which at
  least :data:`MIN_RESTARTS` replicas came down from ``q`` to slot 0: the first, short rounds,
  whose slot 0 has not yet been fed from the hot end, keep the broad initial ``q``;
* the fitted covariance is inflated by :data:`INFLATE` (a slightly wide ``q`` costs little
  barrier; a narrow one misses the target's tails, or a mode);
* a degenerate fit (too few draws, a failed Cholesky factor) keeps the previous ``q``.

(On a two-mode mixture, without these guards 2 of 12 single-system seeds fitted ``q`` to one
mode and reported log Z log 2 off at 80-200 reported errors with R-hat 1.00; with them none
did: tests/test_gaussian_reference.py.)

``reference = "gaussian-fixed"``: the initial ``q`` is kept (a tempered joint against a
broad fixed Gaussian; measured against the refitted one in docs/gaussian_reference.md).

The initial ``q`` (:func:`initial_gaussian`): ``N(m0, s0^2 I)`` with ``m0`` the mean of the
run's initial states and ``s0 = 3 max(1, largest sd of the initial states)``: it covers the
region where the chains start; the first fit (see the guards) replaces it.
"""

from __future__ import annotations

import math

import torch

from nrpt import rng
from nrpt.explorers.base import Density
from nrpt.paths.ladders import GeometricPath, flat_call
from nrpt.paths.variational import (
    VARIATIONAL_STREAM,
    FittedReferenceEngine,
    GaussianReference,
    TargetMoments,
    VariationalRefit,
    fit_gaussian,
)
from nrpt.recorders.stats import per_system
from nrpt.roles import SegmentView, Update

__all__ = ["GAUSSIAN", "GaussianPath", "GaussianDensity", "GaussianEngine", "GaussianRef",
           "initial_gaussian", "FULL_RANK_MAX_DIM", "INFLATE"]

#: the ``reference`` values of this module: refitted between rounds, or fixed
GAUSSIAN = ("gaussian", "gaussian-fixed")
#: full-rank ``q`` up to this dimension, mean-field above
FULL_RANK_MAX_DIM = 200
#: the fitted covariance is multiplied by this factor
INFLATE = 1.5
#: ``s0`` of the initial ``q``: this many times the initial states' largest sd (at least 1)
INITIAL_WIDTH = 3.0
#: ``q`` is refitted only to a round of at least this many pooled slot-0 draws (and at least
#: ``d + 2`` for a full-rank fit) ...
MIN_DRAWS = 100
#: ... in which at least this many restarts (a replica came down from ``q`` to slot 0; summed
#: over the systems, whose draws the fit pools) were seen
MIN_RESTARTS = 1


def initial_gaussian(x0: torch.Tensor, R: int) -> GaussianReference:
    """``q`` before the first fit, from the run's initial states ``x0[..., d]``: ``N(m0,
    s0^2 I)`` (see the module docstring), the same for every system."""
    x = x0.reshape(-1, x0.shape[-1])
    d = x.shape[-1]
    m0 = x.mean(0)
    sd = x.std(0) if x.shape[0] > 1 else torch.ones_like(m0)
    s0 = INITIAL_WIDTH * max(1.0, float(sd.max()) if torch.isfinite(sd).all() else 1.0)
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    return GaussianReference(m0.expand(R, d).clone(), (s0 * eye).expand(R, d, d).clone())


class GaussianPath(GeometricPath):
    """``log pi_beta = log q + beta (-U - log q)``: ``V = U + log q``, ``base = log q``; states
    ``x[..., R, S, d]`` with the system axis third from the end (as every engine call has it)."""

    def __init__(self, betas, q: GaussianReference, reference: str = "gaussian"):
        super().__init__(betas)
        if not self.has_reference:
            raise ValueError(f"reference {reference!r} needs betas ending at 0 (q is sampled "
                             f"exactly at the hot end); got betas[-1] = {self.betas[-1]:g}")
        self.reference = reference
        self.set_reference(q)

    def set_reference(self, q: GaussianReference) -> None:
        self.q = q
        self.rows = torch.arange(q.mean.shape[0], device=q.mean.device)

    def components(self, target, x):
        u = flat_call(target.energy, x, "energy")
        lq = self.q.log_prob(x, self.rows)
        return u + lq, lq

    def reference_sd(self) -> torch.Tensor:
        """The sd of ``q`` per coordinate (of system 0's ``q``)."""
        return (self.q.chol[0] ** 2).sum(-1).sqrt()

    def describe(self) -> dict:
        return {**super().describe(), "reference": self.reference}


class GaussianDensity(Density):
    """:class:`~nrpt.explorers.base.Density` for :class:`GaussianPath`: a target-supplied
    gradient of the energy (``energy_and_grad`` or ``grad_energy``) plus the closed-form
    gradient of ``log q``; otherwise autograd through the components."""

    def _supplied_components(self, x):
        t, path = self.target, self.path
        if not (hasattr(t, "energy_and_grad") or hasattr(t, "grad_energy")):
            return None
        flat = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            if hasattr(t, "energy_and_grad"):
                u, gu = t.energy_and_grad(flat)
            else:
                u, gu = t.energy(flat), t.grad_energy(flat)
            u = u.to(x.dtype).reshape(x.shape[:-1])
            gu = gu.to(x.dtype).reshape(x.shape)
            lq = path.q.log_prob(x, path.rows)
            gq = path.q.grad_log_prob(x, path.rows)
        return u + lq, lq, gu + gq, gq


class GaussianEngine(FittedReferenceEngine):
    """:class:`~nrpt.core.engine.PTEngine` whose hot end is ``q`` (draws from
    :data:`~nrpt.paths.variational.VARIATIONAL_STREAM`), which installs a refitted ``q``
    (``Update.reference``, :class:`~nrpt.paths.variational.FittedReferenceEngine`) and keeps
    it in its checkpoints."""

    density_class = GaussianDensity
    path: GaussianPath

    def _reference_block(self, k: int, B: int) -> torch.Tensor:
        g = rng.block_generator(self.seed, VARIATIONAL_STREAM, k, B)
        z = torch.randn(B, self.R, self.dim, generator=g, dtype=self.dtype).to(self.device)
        return self.q.sample(z)

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["gaussian_reference"] = {**self.q.state_dict(), "refits": self.refits.clone(),
                                    "fallbacks": self.fallbacks.clone()}
        return sd

    def load_state_dict(self, sd: dict) -> None:
        gs = sd["gaussian_reference"]
        self.path.set_reference(GaussianReference.from_state(gs, self.dtype, self.device))
        self.refits, self.fallbacks = gs["refits"].clone(), gs["fallbacks"].clone()
        self._ref_rows = None
        super().load_state_dict(sd)


class SlotZeroMoments(TargetMoments):
    """:class:`~nrpt.paths.variational.TargetMoments` over the ``R`` systems (one row each);
    :meth:`pooled` pools all systems when there are at least two (the between-system spread
    of the means enters the co-moment), else each system alone."""

    def pooled(self):
        n, R = self.n, self.E
        m2 = self.m2 if self.full else torch.diag_embed(self.m2)
        if R < 2:
            return torch.full((R,), n, device=self.device), self.mean, m2
        mean = self.mean.mean(0)
        dm = self.mean - mean
        co = m2.sum(0) + n * dm.T @ dm
        d = mean.shape[-1]
        return (torch.full((R,), n * R, device=self.device), mean.expand(R, d),
                co.expand(R, d, d))


class GaussianRefit(VariationalRefit):
    """Between rounds: fit ``q`` (:func:`fit_gaussian`) to the pooled slot-0 draws, inflate its
    covariance by :data:`INFLATE`, and hand it to the engine (``Update.reference``)."""

    name = "gaussian-reference"

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        n, mean, co = view.recorders["target_moments"].pooled()
        prev = self.previous()
        q, ok = fit_gaussian(n, mean, co, self.family, prev)
        # a round too short, or one in which no replica came down from q to slot 0 (in any
        # system: the fit pools them), keeps the previous q
        came = view.recorders["round_trips"].counts()["restarts"].sum().cpu() >= MIN_RESTARTS
        ok = ok & (n.cpu() >= MIN_DRAWS) & came
        q = GaussianReference(torch.where(ok[:, None], q.mean, prev.mean),
                              torch.where(ok[:, None, None], q.chol, prev.chol))
        chol = torch.where(ok[:, None, None], q.chol * math.sqrt(INFLATE), q.chol)
        return Update(reference=(GaussianReference(q.mean, chol), ok),
                      note={"gaussian_refitted": ok.tolist()})


class GaussianRef:
    """The Gaussian reference as the parts it adds to a run (engine, refit adaptor, moments
    recorder, summary fields): ``Run.facts["hot_end"]``."""

    def __init__(self, reference: str, R: int, *, kind: str, path, comm, cfg):
        if reference not in GAUSSIAN:
            raise ValueError(f"reference must be one of {', '.join(GAUSSIAN)}; got "
                             f"{reference!r}")
        if kind != "temperature":
            raise ValueError(f"reference {reference!r} is for targets with energy(x) only; "
                             f"this target has a prior (reference_log_prob): use reference "
                             f"'prior', or 'variational' (a fitted Gaussian leg joined to the "
                             f"prior leg)")
        if reference == "gaussian" and getattr(cfg, "rounds", None) is None:
            raise ValueError("reference 'gaussian' is fitted between adaptive rounds: give "
                             "rounds = N, or use reference 'gaussian-fixed'")
        if not path.has_reference:
            raise ValueError(f"reference {reference!r} needs betas ending at 0 (q is sampled "
                             f"exactly); got betas[-1] = {path.betas[-1]:g}")
        if comm is not None:
            raise ValueError(f"reference {reference!r} runs in one process; got {comm.world} "
                             f"processes")
        self.reference, self.R = reference, int(R)
        self.fitted = reference == "gaussian"
        self.family = None

    def engine(self, target, path, explorer, scheme, rule, *, initial_states, **kwargs
               ) -> GaussianEngine:
        d = int(target.dim)
        self.family = "full-rank" if d <= FULL_RANK_MAX_DIM else "mean-field"
        q0 = initial_gaussian(initial_states, self.R)
        self._engine = GaussianEngine(target, GaussianPath(path.betas, q0, self.reference),
                                      explorer, scheme, rule, systems=self.R,
                                      initial_states=initial_states, **kwargs)
        return self._engine

    def facts(self) -> dict:
        return {"hot_end": self, "reference_normalized": True}

    def adaptors(self) -> list:
        return [GaussianRefit(self.family, lambda: self._engine.q)] if self.fitted else []

    def recorders(self, **kw) -> dict:
        if not self.fitted:
            return {}
        return {"target_moments": SlotZeroMoments(self.R, self._engine.dim,
                                                  self.family == "full-rank", **kw)}

    def summary(self, run) -> dict:
        eng = run.engine
        out = {"reference": self.reference, "gaussian_family": self.family,
               "gaussian_refits": eng.refits, "gaussian_fallbacks": eng.fallbacks,
               "gaussian_mean": eng.q.mean, "gaussian_var": (eng.q.chol ** 2).sum(-1)}
        res = {k: per_system(v, self.R) for k, v in out.items()}
        res["gaussian_note"] = (
            "hot end: a normalized Gaussian q (" + ("refitted between rounds to the pooled "
            f"slot-0 draws, covariance x{INFLATE:g}" if self.fitted else "fixed") +
            "); log Z is that of exp(-energy) itself" + (
                "; chosen by the target's default_reference" if run.facts.get(
                    "reference_from_target") else ""))
        return res
