r"""Parallel tempering with a variational reference, stabilized two-leg form (Surjanovic, Syed,
Bouchard-Côté & Campbell, NeurIPS 2022).

Between adaptive rounds a normalized Gaussian ``q`` (full-rank or mean-field) is fitted to the
target chain's draws by moment matching (the forward-KL minimizer); the *variational leg*
anneals ``log pi_beta = (1 - beta) log q + beta log pi`` and the fixed *prior leg*
``pi_beta ∝ p0 L^beta`` is kept; the legs are joined at the target::

    prior  p0 ... pi  |bridge|  pi ... q   variational
    slot   P-1 ... 0            0 ... P-1

User system ``r`` is engine rows ``2r`` (prior leg) and ``2r + 1`` (variational leg), each with
its own schedule, barrier, round trips and ``log Z``.  Path split ``log pi_p = base - b_p V``:
prior ``V = -l``, ``base = log p0``; variational ``V = -(log p0 + l - log q)``, ``base = log q``.

After the swaps, :class:`TwoLegEngine` exchanges the slot-0 states of rows ``2r`` and ``2r + 1``
(always accepted: both have density ``pi``) on the iterations where pair ``(0, 1)`` was not
attempted; under DEO this is exactly DEO on the joined ``2P``-slot ladder, under other schemes a
pi-invariant move.

Outputs (:class:`TwoLeg`): the samples are the prior leg's slot-0 chain (row ``2r``); the
variational leg's slot 0 is coupled to it by the bridge and is not reported as a separate
chain.  ``samples.npy`` keeps both rows; per-system summary lists have ``2R`` entries (even:
prior leg, odd: variational leg).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from nrpt import rng
from nrpt.core.engine import PTEngine
from nrpt.explorers.base import GRAD_KEYS, Density, ReplicaState
from nrpt.paths.ladders import GeometricPath, flat_call
from nrpt.recorders.stats import per_system
from nrpt.roles import AdaptorBase, RecorderBase, SegmentView, SlotMap, Update

__all__ = ["REFERENCES", "VARIATIONAL", "GaussianReference", "fit_gaussian", "TwoLegPath",
           "TwoLegDensity", "TwoLegEngine", "TargetMoments", "VariationalRefit", "TwoLeg"]

#: the ``reference`` setting: what the hot end of the ladder is ("gaussian", "gaussian-fixed":
#: :mod:`nrpt.paths.gaussian_reference`, for targets with ``energy(x)`` only)
REFERENCES = ("prior", "variational", "variational-meanfield", "gaussian", "gaussian-fixed")
#: ``reference`` values that run the two-leg ladder, and the covariance family of their ``q``
VARIATIONAL = {"variational": "full-rank", "variational-meanfield": "mean-field"}
#: stream tag of the Gaussian draws of the variational reference (the prior's draws keep
#: :data:`nrpt.rng.Stream.REFERENCE`)
VARIATIONAL_STREAM = rng.Stream.USER + 1
#: covariance shrinkage toward its diagonal: lambda = d / (n + d) (full-rank fits), and the
#: jitter added to the diagonal, relative to its mean
JITTER = 1e-6
#: the summary carries a full-rank q's whole covariance up to this dimension (its diagonal,
#: ``variational_var``, always; the checkpoint always holds the Cholesky factor)
FULL_COV_IN_SUMMARY = 32


@dataclass
class GaussianReference:
    """``q_r = N(mean[r], chol[r] chol[r]^T)`` for each user system ``r`` (``[R, d]``,
    ``[R, d, d]`` lower triangular).  ``inv`` and ``logdet`` (of the covariance) are derived."""

    mean: torch.Tensor
    chol: torch.Tensor

    def __post_init__(self):
        d = self.mean.shape[-1]
        eye = torch.eye(d, dtype=self.chol.dtype, device=self.chol.device).expand_as(self.chol)
        self.inv = torch.linalg.solve_triangular(self.chol, eye, upper=False)
        self.logdet = 2.0 * torch.diagonal(self.chol, dim1=-2, dim2=-1).log().sum(-1)

    @property
    def dim(self) -> int:
        return int(self.mean.shape[-1])

    def _z(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Whitened ``x[..., E, S, d]``: ``chol^-1 (x - mean)`` with engine row ``e``'s q."""
        m = self.mean[rows][:, None]  # [E, 1, d]
        inv = self.inv[rows][:, None]  # [E, 1, d, d]
        return (inv @ (x - m)[..., None]).squeeze(-1)

    def log_prob(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``log q`` of ``x[..., E, S, d]`` where engine row ``e`` uses ``q_{rows[e]}``."""
        z = self._z(x, rows)
        c = self.logdet[rows][:, None] + self.dim * math.log(2 * math.pi)
        return -0.5 * ((z * z).sum(-1) + c)

    def grad_log_prob(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``grad log q = -chol^-T z`` at ``x[..., E, S, d]`` (rows as :meth:`log_prob`)."""
        inv = self.inv[rows][:, None]
        return -(inv.transpose(-1, -2) @ self._z(x, rows)[..., None]).squeeze(-1)

    def sample(self, z: torch.Tensor) -> torch.Tensor:
        """Draws from standard normals ``z[..., R, d]`` (one per user system)."""
        return self.mean + (self.chol @ z[..., None]).squeeze(-1)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "chol": self.chol}

    @classmethod
    def from_state(cls, sd: dict, dtype, device) -> GaussianReference:
        return cls(sd["mean"].to(device, dtype), sd["chol"].to(device, dtype))


def fit_gaussian(n: torch.Tensor, mean: torch.Tensor, comoment: torch.Tensor, family: str,
                 previous: GaussianReference) -> tuple[GaussianReference, torch.Tensor]:
    """Moment matching per user system: ``q_r = N(sample mean, regularized covariance)``.

    ``n[R]`` draws with running ``mean[R, d]`` and ``comoment[R, d, d]`` (sum of centred outer
    products).  The covariance is shrunk toward its diagonal (full-rank: weight ``d / (n + d)``
    on the diagonal; mean-field: the diagonal alone) and given a relative jitter on the
    diagonal.  A system whose fit is degenerate (fewer than ``d + 2`` draws for a full-rank
    fit, 3 for mean-field, a non-finite moment, a zero variance or a failed Cholesky factor)
    keeps its previous ``q``.  Returns ``(q, refitted[R] bool)``."""
    R, d = mean.shape
    nf = n.to(mean.dtype)
    cov = comoment / (nf - 1).clamp_min(1)[:, None, None]
    diag = torch.diagonal(cov, dim1=-2, dim2=-1)
    if family == "mean-field":
        cov = torch.diag_embed(diag)
        need = 3
    else:
        lam = (d / (nf + d))[:, None, None]
        cov = (1 - lam) * cov + lam * torch.diag_embed(diag)
        need = d + 2
    jitter = JITTER * diag.mean(-1).abs().clamp_min(1e-300)
    cov = cov + jitter[:, None, None] * torch.eye(d, dtype=cov.dtype, device=cov.device)
    chol, info = torch.linalg.cholesky_ex(cov)
    ok = ((n >= need) & (info == 0) & torch.isfinite(mean).all(-1)
          & torch.isfinite(chol).all(-1).all(-1) & (diag > 0).all(-1))
    new_mean = torch.where(ok[:, None], mean, previous.mean)
    new_chol = torch.where(ok[:, None, None], chol, previous.chol)
    return GaussianReference(new_mean, new_chol), ok


def initial_reference(target, R: int, seed: int, dtype, device, family: str,
                      n: int = 4096) -> GaussianReference:
    """``q`` before the first fit: moment-matched to ``n`` prior draws (keyed by the seed),
    so that before the first round both legs anneal from (nearly) the same reference."""
    g = rng.generator_for(seed, VARIATIONAL_STREAM, 0x1417)
    x = torch.as_tensor(target.reference_sample(n, g)).to(device, dtype)
    m = x.mean(0)
    xc = x - m
    d = x.shape[-1]
    eye = torch.eye(d, dtype=dtype, device=device)
    prev = GaussianReference(m.expand(R, d).clone(), eye.expand(R, d, d).clone())
    q, _ = fit_gaussian(torch.full((R,), n, device=device), m.expand(R, d),
                         (xc.T @ xc).expand(R, d, d), family, prev)
    return q


class TwoLegPath(GeometricPath):
    """The geometric path of both legs (see the module docstring); ``components`` takes
    states ``x[..., E, S, d]`` whose engine row (system) axis ``E = 2R`` is third from the
    end, as every engine call has it (explorers: ``[..., E, P, d]``; reference draws
    ``[B, E, 1, d]``)."""

    def __init__(self, betas, R: int, q: GaussianReference):
        super().__init__(betas)
        self.R = int(R)
        E = 2 * self.R
        self.rows = torch.arange(E, device=q.mean.device) // 2  # engine row -> user system
        self.leg = (torch.arange(E, device=q.mean.device) % 2 == 1)[:, None]  # [E, 1]
        self.q = q
        if not self.has_reference:
            raise ValueError("reference 'variational' needs betas ending at 0 (the references "
                             "are sampled exactly at the hot end of each leg)")

    def set_reference(self, q: GaussianReference) -> None:
        self.q = q

    def split(self, target, x):
        """``(l, log p0, log q)`` at ``x``."""
        ll = flat_call(target.log_likelihood, x, "log_likelihood")
        lp0 = flat_call(target.reference_log_prob, x, "reference_log_prob")
        return ll, lp0, self.q.log_prob(x, self.rows)

    def components(self, target, x):
        ll, lp0, lq = self.split(target, x)
        v = torch.where(self.leg, -(lp0 + ll - lq), -ll)
        base = torch.where(self.leg, lq, lp0)
        return v, base

    def describe(self) -> dict:
        return {**super().describe(), "legs": ["prior", "variational"]}


class TwoLegDensity(Density):
    """:class:`~nrpt.explorers.base.Density` for :class:`TwoLegPath`: target-supplied
    gradients (``grad_log_likelihood``, ``grad_reference_log_prob``) are combined per leg with
    the closed-form gradient of ``log q``; otherwise autograd through the components."""

    def _supplied_components(self, x):
        plain = super()._supplied_components(x)  # (v, base) of the two legs, -grad l, grad p0
        if plain is None:
            return None
        v, base, minus_g_ll, g_ref = plain
        path = self.path
        g_q = path.q.grad_log_prob(x, path.rows)
        leg = path.leg[..., None]
        g_v = torch.where(leg, -(g_ref - minus_g_ll - g_q), minus_g_ll)
        g_base = torch.where(leg, g_q, g_ref)
        return v, base, g_v, g_base


class FittedReferenceEngine(PTEngine):
    """A :class:`~nrpt.core.engine.PTEngine` whose path's hot end is a Gaussian ``q`` refitted
    between rounds (``Update.reference = (q, refitted[R])``, :class:`VariationalRefit`): the
    two-leg engine here and the one-leg :class:`nrpt.paths.gaussian_reference.GaussianEngine`.
    It counts refits and fallbacks per user system (:attr:`rows_per_system` engine rows each)
    and, on a new ``q``, recomputes the cached components of the replicas :meth:`_on_q`
    names."""

    rows_per_system = 1

    def __init__(self, target, path, *args, **kwargs):
        super().__init__(target, path, *args, **kwargs)
        self.user_R = self.R // self.rows_per_system
        self.refits = torch.zeros(self.user_R, dtype=torch.int64)
        self.fallbacks = torch.zeros(self.user_R, dtype=torch.int64)

    @property
    def q(self) -> GaussianReference:
        return self.path.q

    def apply(self, update: Update | None) -> SlotMap | None:
        """:meth:`PTEngine.apply` (its return value), then ``update.reference`` (a newly fitted
        ``q``) installed."""
        if update is None or update.reference is None:
            return super().apply(update)
        resized = super().apply(replace(update, reference=None))
        self.set_fitted_reference(update.reference)
        return resized

    def set_fitted_reference(self, reference) -> None:
        """``Update.reference = (q, refitted[R])`` from :class:`VariationalRefit`."""
        q, ok = reference
        ok = torch.as_tensor(ok, dtype=torch.bool).cpu()
        self.refits += ok.long()
        self.fallbacks += (~ok).long()
        self.set_reference(GaussianReference.from_state(q.state_dict(), self.dtype,
                                                        self.device))

    def _on_q(self) -> torch.Tensor | None:
        """``[R, P]`` mask of the replicas whose density involves ``q`` (``None``: all)."""
        return None

    def set_reference(self, q: GaussianReference) -> None:
        """Install a new ``q``: the cached components (and gradient caches) of the replicas
        on ``q`` are recomputed and the block of reference draws is dropped."""
        self.path.set_reference(q)
        st = self.state
        v, base = self.density(st.x)
        plain = {k: t for k, t in st.extras.items() if k not in GRAD_KEYS}
        fresh = self.explorer.prepare(ReplicaState(st.x, v, base, plain), self.density)
        mask = self._on_q()
        self.state = fresh if mask is None else st.where(mask, fresh)
        self._ref_rows = None


class TwoLegEngine(FittedReferenceEngine):
    """:class:`~nrpt.core.engine.PTEngine` over ``2R`` rows, two per user system (prior leg,
    variational leg), with leg-aware reference draws, the bridge after the swaps and the
    reference ``q`` in its checkpoints.  Plain runs never construct it."""

    density_class = TwoLegDensity
    path: TwoLegPath
    rows_per_system = 2

    def __init__(self, target, path: TwoLegPath, *args, **kwargs):
        super().__init__(target, path, *args, **kwargs)
        self.bridges = torch.zeros((), dtype=torch.int64, device=self.device)
        self._partner = torch.arange(self.R, device=self.device) ^ 1  # engine rows 2r <-> 2r+1

    # ------------------------------------------------------------------ the reference
    def _on_q(self) -> torch.Tensor:
        """The variational rows (the prior leg's components do not involve ``q``)."""
        return self.path.leg.expand(self.R, self.P)

    def _reference_block(self, k: int, B: int) -> torch.Tensor:
        """Prior draws for the even rows (the plain run's stream, blocks sized for the ``2R``
        rows), draws from ``q`` for the odd rows: ``[B, 2R, d]``."""
        E, R, d = self.R, self.user_R, self.dim
        xp = self._prior_draws(k, B, R)
        gq = rng.block_generator(self.seed, VARIATIONAL_STREAM, k, B)
        z = torch.randn(B, R, d, generator=gq, dtype=self.dtype).to(self.device)
        return torch.stack([xp, self.q.sample(z)], dim=2).reshape(B, E, d)

    # ------------------------------------------------------------------ the bridge
    def step(self):
        it = super().step()
        _, attempted = it.attempted_indicators
        quiet = ~attempted[:, 0]  # pair (0, 1) not attempted this iteration, per row
        go = quiet[0::2] & quiet[1::2]  # [R]
        if bool(go.any()):
            self._bridge(go)
            it.state = self.state
        return it

    def _bridge(self, go: torch.Tensor) -> None:
        """Exchange the slot-0 states of rows 2r and 2r+1 where ``go[r]``."""
        st, E = self.state, self.R
        rep = self.replica_at[:, :1]  # [E, 1] replica at slot 0 of each row
        partner = self._partner
        mask = go.repeat_interleave(2)  # [E]

        def index(t):  # rep, shaped to gather / scatter one row of t [E, P, ...]
            return rep.reshape(E, 1, *([1] * (t.dim() - 2))).expand(E, 1, *t.shape[2:])

        x0 = st.x.gather(1, index(st.x))[partner]  # the partner row's slot-0 state [E, 1, d]
        extras0 = {n: t.gather(1, index(t))[partner] for n, t in st.extras.items()}
        plain = {k: t for k, t in extras0.items() if k not in GRAD_KEYS}
        v0, b0 = self.density(x0)
        moved = self.explorer.prepare(ReplicaState(x0, v0, b0, plain), self.density)
        extras = {**extras0, **moved.extras}

        def put(t, small):  # out of place: t with its slot-0 row replaced where mask
            new = t.scatter(1, index(t), small.to(t.dtype))
            m = mask.reshape(E, *([1] * (t.dim() - 1)))
            return torch.where(m, new, t)

        self.state = ReplicaState(put(st.x, moved.x), put(st.v, moved.v),
                                  put(st.base, moved.base),
                                  {n: put(t, extras[n]) if n in extras else t
                                   for n, t in st.extras.items()})
        self.bridges += mask.sum() // 2  # a tensor: no host sync per iteration

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["variational"] = {**self.q.state_dict(), "refits": self.refits.clone(),
                             "fallbacks": self.fallbacks.clone(),
                             "bridges": self.bridges.clone()}
        return sd

    def load_state_dict(self, sd: dict) -> None:
        vs = sd["variational"]
        self.path.set_reference(GaussianReference.from_state(vs, self.dtype, self.device))
        self.refits, self.fallbacks = vs["refits"].clone(), vs["fallbacks"].clone()
        self.bridges = torch.as_tensor(vs["bridges"], dtype=torch.int64, device=self.device)
        self._ref_rows = None
        super().load_state_dict(sd)


class TargetMoments(RecorderBase):
    """Running mean and co-moment (Welford) of the slot-0 states of every engine row since the
    last reset -- the draws the next ``q`` is fitted to.  ``full``: keep the ``d x d``
    co-moment (full-rank fits), else its diagonal only."""

    name = "target_moments"
    reads_slots = (0,)

    def __init__(self, E: int, dim: int, full: bool, dtype=torch.float64, device="cpu"):
        self.E, self.dim, self.full = E, dim, bool(full)
        self.dtype, self.device = dtype, device
        self.start_segment(True)

    def start_segment(self, reset: bool, length: int = 0) -> None:
        if reset:
            self.n = 0
            self.mean = torch.zeros(self.E, self.dim, dtype=self.dtype, device=self.device)
            shape = (self.E, self.dim, self.dim) if self.full else (self.E, self.dim)
            self.m2 = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def record(self, it) -> None:
        x = it.slot_x([0])[:, 0]
        self.n += 1
        delta = x - self.mean
        self.mean = self.mean + delta / self.n
        after = x - self.mean
        if self.full:
            self.m2 = self.m2 + delta[:, :, None] * after[:, None, :]
        else:
            self.m2 = self.m2 + delta * after

    def pooled(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(n[R], mean[R, d], comoment[R, d, d])`` pooling both rows of each user system
        (both slot-0 chains target ``pi``)."""
        n = self.n
        ma, mb = self.mean[0::2], self.mean[1::2]
        m2 = self.m2 if self.full else torch.diag_embed(self.m2)
        mean = 0.5 * (ma + mb)
        dm = ma - mb
        co = m2[0::2] + m2[1::2] + 0.5 * n * dm[:, :, None] * dm[:, None, :]
        R = ma.shape[0]
        return torch.full((R,), 2 * n, device=self.device), mean, co

    def state_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, sd: dict) -> None:
        self.n, self.mean, self.m2 = int(sd["n"]), sd["mean"], sd["m2"]


class VariationalRefit(AdaptorBase):
    """Between rounds: fit ``q`` to the round's target draws (the ``target_moments`` recorder,
    :func:`fit_gaussian`) and hand it to the engine (``Update.reference``)."""

    name = "variational"

    def __init__(self, family: str, previous):
        self.family = family
        self.previous = previous  # a callable returning the engine's current q

    def end_segment(self, view: SegmentView) -> Update | None:
        if view.last:
            return None
        n, mean, co = view.recorders["target_moments"].pooled()
        q, ok = fit_gaussian(n, mean, co, self.family, self.previous())
        return Update(reference=(q, ok),
                      note={"variational_refitted": ok.tolist()})


class TwoLeg:
    """The two-leg reference as one object (cf. Pigeons' ``StabilizedPT``): its legs (prior,
    variational), the indexer from engine rows to user systems (row ``2r`` the prior leg of
    system ``r``, row ``2r + 1`` its variational leg), the parts it adds to a run (engine,
    refit adaptor, moments recorder) and, as the run's :class:`nrpt.roles.RowMap`
    (``Run.facts["row_map"]``), what the outputs ask instead of slicing rows."""

    #: the engine rows whose slot-0 chains are the run's samples: the prior leg's
    chain_rows = slice(0, None, 2)
    #: attached to the index-process statistics of ``posterior.nc``
    index_note = ("the prior leg's index process: the bridge to the variational leg "
                  "exchanges states, not replicas, and does not show here")

    def __init__(self, reference: str, R: int, *, kind: str, path, comm, cfg):
        """Check that ``reference`` can run: a geometric target whose path ends at the prior,
        adaptive rounds, and one process; ``R`` user systems."""
        if kind != "geometric":
            raise ValueError(f"reference {reference!r} needs a geometric target (log_likelihood, "
                             f"reference_log_prob, reference_sample); this target has only "
                             f"energy(x): use reference 'prior'")
        if getattr(cfg, "rounds", None) is None:
            raise ValueError(f"reference {reference!r} is fitted between adaptive rounds: give "
                             f"rounds = N, or use reference 'prior'")
        if not path.has_reference:
            raise ValueError(f"reference {reference!r} needs betas ending at 0 (both legs' "
                             f"references are sampled exactly); got betas[-1] = "
                             f"{path.betas[-1]:g}")
        if comm is not None:
            raise ValueError(f"reference {reference!r} runs in one process; got {comm.world} "
                             f"processes (use reference 'prior' with --nproc)")
        self.reference, self.family = reference, VARIATIONAL[reference]
        self.R, self.E = int(R), 2 * int(R)  # user systems, engine rows

    # ------------------------------------------------------------------ the run's parts
    def engine(self, target, path, explorer, scheme, rule, *, seed: int, dtype, device,
               **kwargs) -> TwoLegEngine:
        """The engine over :attr:`E` rows, its ``q`` fitted to prior draws (keyed by ``seed``)."""
        q0 = initial_reference(target, self.R, seed, dtype, device, self.family)
        self._engine = TwoLegEngine(target, TwoLegPath(path.betas, self.R, q0), explorer,
                                    scheme, rule, systems=self.E, seed=seed, dtype=dtype,
                                    device=device, **kwargs)
        return self._engine

    def facts(self, target) -> dict:
        """The run's facts: q is normalized, so the variational leg's stepping stone is log Z
        when the prior is."""
        return {"row_map": self, "reference_normalized": bool(
            getattr(target, "reference_is_normalized", False))}

    def adaptor(self) -> VariationalRefit:
        return VariationalRefit(self.family, lambda: self._engine.q)

    def recorders(self, **kw) -> dict:
        return {"target_moments": TargetMoments(self.E, self._engine.dim,
                                                self.family == "full-rank", **kw)}

    # ------------------------------------------------------------------ the indexer
    def chains(self, arrays: dict) -> dict:
        """The draws' ``samples`` / ``energies`` ``[E, n, ...]`` and ``index`` ``[K + 1, E, P]``
        cut to the user's chains (:attr:`chain_rows`; one system: ``[n, ...]``), in place."""
        for name in ("samples", "energies"):
            a = np.asarray(arrays[name])[self.chain_rows]
            arrays[name] = a[0] if a.shape[0] == 1 else a
        arrays["index"] = np.asarray(arrays["index"])[:, self.chain_rows]  # [K + 1, R, P]
        return arrays

    @staticmethod
    def row_label(i: int) -> str:
        return f"system {i // 2}, {'variational' if i % 2 else 'prior'} leg"

    def posterior_parts(self, value, R: int) -> list:
        """``(suffix, value, label)`` of a per-system summary value in ``posterior.nc``: each
        leg's entries get a variable of their own."""
        if isinstance(value, list) and len(value) == 2 * R:
            return [("_prior_leg", value[0::2], " (prior leg)"),
                    ("_variational_leg", value[1::2], " (variational leg)")]
        return [("", value, "")]

    # ------------------------------------------------------------------ the summary
    @staticmethod
    def text(s: dict, scalar) -> list[str]:
        """The summary text's line for the legs; ``scalar(value, spec=".3g")`` formats a
        per-system scalar."""
        return [f"  legs            barrier Λ̂ prior leg {scalar(s['barrier_prior_leg'])}"
                f", variational leg {scalar(s['barrier_variational_leg'])} "
                f"({s.get('reference')}); log Z "
                f"{scalar(s.get('log_normalizer_prior_leg'), '.4g')} / "
                f"{scalar(s.get('log_normalizer_variational_leg'), '.4g')}"]

    @staticmethod
    def _legs_z(est: dict) -> torch.Tensor:
        """Per user system: (prior leg - variational leg) bridge log Z over the combined
        batch-means error (the legs' errors added in quadrature, as if independent: they share
        only the slot-0 exchanges of the bridge between legs)."""
        a, b = est["log_normalizer"][0::2], est["log_normalizer"][1::2]
        return (a - b) / (est["se"][0::2].square() + est["se"][1::2].square()).sqrt()

    def findings(self, run) -> list:
        """A ``log-z-legs`` finding where the two legs' log Z (both absolute: the prior
        declared normalized) disagree beyond :data:`nrpt.recorders.log_z.HALVES_Z` combined
        errors."""
        from nrpt.recorders.log_z import HALVES_Z
        from nrpt.report.health import Finding

        lz = run.recorders.get("log_z")
        if lz is None or lz.n == 0 or not run.facts.get("reference_normalized"):
            return []
        est = {k: v.detach().cpu().double() for k, v in lz.estimate().items()}
        z = self._legs_z(est)
        bad = [r for r in range(z.shape[0]) if math.isfinite(float(z[r]))
               and abs(float(z[r])) > HALVES_Z]
        if not bad:
            return []
        r = max(bad, key=lambda j: abs(float(z[j])))
        more = f" ({len(bad)} systems in all)" if len(bad) > 1 else ""
        pa, va = float(est["log_normalizer"][2 * r]), float(est["log_normalizer"][2 * r + 1])
        return [Finding("log-z-legs", (
            f"the two legs' log Z disagree in system {r}{more}: prior leg {pa:.4g} ± "
            f"{float(est['se'][2 * r]):.2g}, variational leg {va:.4g} ± "
            f"{float(est['se'][2 * r + 1]):.2g}, {abs(float(z[r])):.1f} combined errors apart "
            f"(threshold {HALVES_Z:g}): at least one leg's ladder overlaps too little for its "
            f"error bar; trust neither until they agree"),
            "iterations / chains (or rounds, to refit q)")]

    def summary(self, run) -> dict:
        """Per-leg fields for the summary (per-system lists of the rest have :attr:`E`
        entries)."""
        eng, rec, R = run.engine, run.recorders, self.R
        bar = rec["swaps"].barrier()
        out = {"systems": R, "engine_systems": self.E,
               "reference": self.reference, "variational_family": self.family,
               "barrier_prior_leg": bar[0::2], "barrier_variational_leg": bar[1::2],
               "bridges": int(eng.bridges),
               "variational_refits": eng.refits, "variational_fallbacks": eng.fallbacks,
               "variational_mean": eng.q.mean,
               "variational_var": (eng.q.chol ** 2).sum(-1),
               "schedule_prior_leg": eng.schedule[0::2], "schedule_variational_leg":
                   eng.schedule[1::2]}
        rt = rec["round_trips"].counts()
        n = max(rec["round_trips"].n, 1)
        out["restart_rate_prior_leg"] = rt["restarts"][0::2].double() / n
        out["restart_rate_variational_leg"] = rt["restarts"][1::2].double() / n
        if self.family == "full-rank" and eng.dim <= FULL_COV_IN_SUMMARY:
            out["variational_cov"] = eng.q.chol @ eng.q.chol.transpose(-1, -2)
        lz = rec.get("log_z")
        normalized = run.facts.get("reference_normalized")
        if lz is not None:
            est = lz.estimate()
            for key, name in (("log_normalizer", ""), ("se", "_se"), ("halves_z", "_halves_z")):
                out[f"log_normalizer_prior_leg{name}"] = est[key][0::2]
                out[f"log_normalizer_variational_leg{name}"] = est[key][1::2]
            if normalized:
                out["log_normalizer_legs_z"] = self._legs_z(est)
        res = {k: per_system(v, R) for k, v in out.items()}
        if lz is not None and not normalized:
            # q is normalized, the prior is not declared so: the legs estimate different things
            res["log_normalizer_legs_note"] = (
                "the prior is not declared normalized (reference_is_normalized): the prior leg "
                "estimates log(Z / Z_prior), the variational leg (q normalized) log Z itself, "
                "so the two differ by log Z_prior")
        return res
