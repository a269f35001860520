r"""Theoretical round-trip, restart and barrier formulas for (non-reversible) PT.

Pure numpy / Python; every function validates its arguments and raises
:class:`ValueError` naming the offending argument and its allowed range.

Notation: ``P`` chains (slots ``0..P-1``), ``r_p`` the rejection rate of the swap
between adjacent slots ``p`` and ``p+1`` (``P-1`` rates), ``W`` the window size of the
generalized DEO scheme ``DEO_W`` (each even/odd swap phase lasts ``W`` iterations).

References
----------
* S. Syed, A. Bouchard-Côté, G. Deligiannidis, A. Doucet (2021), "Non-reversible
  parallel tempering: a scalable highly parallel MCMC scheme", JRSS-B.
* W. Deng, Q. Zhang, Q. Feng, F. Liang, G. Lin (2023), "Non-reversible parallel
  tempering for deep posterior approximation", AAAI (Lemma 1, Eq. 4; Table 1).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

__all__ = [
    "lemma1_round_trip_time",
    "predicted_round_trips_per_1000",
    "predicted_rates",
    "exact_event_rates",
    "optimal_window",
    "barrier_from_rejections",
    "cumulative_barrier",
    "predicted_restart_rate",
    "asymptotic_restart_rate",
    "scheme_orders",
]


def _rejections(rejection: Sequence[float] | np.ndarray, name: str = "rejection") -> np.ndarray:
    """Validate a 1-D sequence of ``P-1 >= 1`` rejection rates in ``[0, 1]``."""
    try:
        r = np.asarray(rejection, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of rates in [0, 1]") from None
    if r.ndim != 1 or r.size < 1:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence of the P-1 adjacent rejection rates "
            f"(rates in [0, 1]), got shape {r.shape}"
        )
    if not np.all(np.isfinite(r)) or np.any(r < 0.0) or np.any(r > 1.0):
        raise ValueError(f"{name} must contain rates in [0, 1], got {r.tolist()}")
    return r


def _window(window) -> int:
    if isinstance(window, bool):
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    try:
        w = operator.index(window)
    except TypeError:
        raise ValueError(f"window must be an integer >= 1, got {window!r}") from None
    if w < 1:
        raise ValueError(f"window must be an integer >= 1, got {w}")
    return w


def lemma1_round_trip_time(rejection: Sequence[float] | np.ndarray, window: int = 1) -> float:
    """Expected round-trip time of ``DEO_W`` (Deng et al. 2023, Lemma 1, Eq. 4)::

        E[T] = 2WP + 2WP sum_{p=0}^{P-2} r_p^W / (1 - r_p^W),

    ``P = len(rejection) + 1``, ``W = window``; at ``W = 1`` Syed et al.'s (2021) DEO time.
    ``inf`` if any ``r_p == 1``."""
    r = _rejections(rejection)
    w = _window(window)
    n_chains = r.size + 1
    if np.any(r >= 1.0):
        return math.inf
    rw = r**w
    return float(2 * w * n_chains * (1.0 + np.sum(rw / (1.0 - rw))))


def predicted_round_trips_per_1000(
    rejection: Sequence[float] | np.ndarray, window: int = 1, *, scheme: str
) -> float:
    """Predicted Syed et al. round trips (= restarts) per 1000 iterations, summed over replicas.

    * ``"deo"`` / ``"deo-w"``: Lemma 1 of Deng et al. (2023, Eq. 4), ``1000 P / E[T]``; at
      ``W = 1`` Syed et al. (2021, Theorem 1), ``1000 / (2 + 2 sum_p r_p / (1 - r_p))``;
    * ``"seo"``, ``"adj"``, ``"ape"``: the exact rate of :func:`exact_event_rates`.

    Not the appendix-A.5 round trips (see :func:`predicted_rates`).  Returns ``0`` if some
    ``r_p = 1`` cuts the ladder."""
    r = _rejections(rejection)
    name, w = _scheme(scheme, window)
    if name in ("deo", "deo-w"):
        expected_time = lemma1_round_trip_time(r, w)
        if math.isinf(expected_time):
            return 0.0
        return 1000.0 * (r.size + 1) / expected_time
    return 1000.0 * exact_event_rates(r, name, w)["restarts"]


def predicted_rates(
    rejection: Sequence[float] | np.ndarray, scheme: str, window: int = 1
) -> dict[str, float | None]:
    """Predictions of a run's three event rates per 1000 iterations, summed over the ``P`` replicas.

    Keys as :class:`~nrpt.diagnostics.RoundTripTracker`: ``restarts_per_1000`` (DEO / DEO_W:
    Lemma 1 of Deng et al. 2023, Eq. 4; SEO / ADJ: :func:`exact_event_rates`),
    ``round_trips_per_1000`` (Syed round trips: the restart rate) and ``round_trips_a5_per_1000``
    (appendix-A.5 round trips: :func:`exact_event_rates`).  Assumes independent swap decisions
    with rejection ``r_p`` on pair ``(p, p+1)`` (exact under :class:`~nrpt.swap.FixedRate`;
    assumptions B1-B2 of Deng et al. otherwise).  APE: every value ``None`` (its non-adjacent
    pairs' rates are not determined by the adjacent ones)."""
    r = _rejections(rejection)
    name, w = _scheme(scheme, window)
    if name == "ape":
        return dict.fromkeys(
            ("restarts_per_1000", "round_trips_per_1000", "round_trips_a5_per_1000"), None
        )
    lemma = name in ("deo", "deo-w")  # restarts in closed form: only the A.5 chain is solved
    exact = exact_event_rates(r, name, w, a5_only=lemma)
    restarts = (predicted_round_trips_per_1000(r, w, scheme=name) if lemma
                else 1000.0 * exact["restarts"])
    return {
        "restarts_per_1000": restarts,
        "round_trips_per_1000": restarts,
        "round_trips_a5_per_1000": 1000.0 * exact["round_trips_a5"],
    }


def optimal_window(n_chains: int, rejection_rate: float) -> int:
    """Optimal window ``W* = ceil((log P + log log P) / -log r)`` of ``DEO_W`` (Deng et al. 2023,
    from Lemma 1): ``r^W <~ 1 / (P log P)``, so the round-trip time is ``O(P log P)``.

    ``W* = 1`` for ``P <= 3`` and for ``r <= 0``; never below 1.  ``n_chains``: ``P >= 2``
    (int); ``rejection_rate``: common ``r < 1`` (not NaN)."""
    if isinstance(n_chains, bool):
        raise ValueError(f"n_chains must be an integer >= 2, got {n_chains!r}")
    try:
        n = operator.index(n_chains)
    except TypeError:
        raise ValueError(f"n_chains must be an integer >= 2, got {n_chains!r}") from None
    if n < 2:
        raise ValueError(f"n_chains must be an integer >= 2, got {n}")
    try:
        r = float(rejection_rate)
    except (TypeError, ValueError):
        raise ValueError(
            f"rejection_rate must be a number in [0, 1), got {rejection_rate!r}"
        ) from None
    if math.isnan(r) or r >= 1.0:
        raise ValueError(f"rejection_rate must be a number in [0, 1), got {rejection_rate!r}")
    if n <= 3 or r <= 0.0:
        return 1
    w = math.ceil((math.log(n) + math.log(math.log(n))) / (-math.log(r)))
    return max(1, int(w))


def barrier_from_rejections(rejection: Sequence[float] | np.ndarray) -> float:
    r"""Estimated global communication barrier :math:`\hat\Lambda = \sum_p r_p` (Syed et al. 2021).

    For a fine schedule the rejection rates sum to the barrier
    :math:`\Lambda = \int_0^1 \lambda(\beta)\, d\beta`, independently of ``P``.
    """
    return float(np.sum(_rejections(rejection)))


def cumulative_barrier(rejection: Sequence[float] | np.ndarray) -> np.ndarray:
    r"""Cumulative barrier :math:`\hat\Lambda(\beta_p) = \sum_{q < p} r_q`, shape ``[P]``.

    Starts at ``0`` for slot ``0`` and ends at :func:`barrier_from_rejections`; it is
    the quantity whose equispacing the adaptive schedule of Syed et al. (2021) targets.
    """
    r = _rejections(rejection)
    return np.concatenate([[0.0], np.cumsum(r)])


def predicted_restart_rate(rejection: Sequence[float] | np.ndarray) -> float:
    """Finite-``P`` DEO restarts per iteration, summed over replicas (Syed et al. 2021, Theorem 1):
    ``tau = 1 / (2 + 2 sum_p r_p / (1 - r_p))`` (``= P / E[T]`` of Lemma 1 at ``W = 1``); ``0`` if
    any ``r_p == 1``."""
    r = _rejections(rejection)
    if np.any(r >= 1.0):
        return 0.0
    return float(1.0 / (2.0 + 2.0 * np.sum(r / (1.0 - r))))


def asymptotic_restart_rate(barrier: float) -> float:
    r"""Large-``P`` DEO restart rate :math:`\bar\tau = 1 / (2 + 2\Lambda)` (Syed et al. 2021).

    ``barrier`` is the global communication barrier :math:`\Lambda \ge 0`.
    """
    try:
        lam = float(barrier)
    except (TypeError, ValueError):
        raise ValueError(f"barrier must be a finite number >= 0, got {barrier!r}") from None
    if not math.isfinite(lam) or lam < 0.0:
        raise ValueError(f"barrier must be a finite number >= 0, got {barrier!r}")
    return 1.0 / (2.0 + 2.0 * lam)


def scheme_orders(n_chains: int, rejection_rate: float) -> dict[str, float]:
    """Round-trip times for a uniform rejection rate (cf. Deng et al. Table 1): ``{"DEO"``
    (Lemma 1, ``W = 1``), ``"W_star"`` (:func:`optimal_window`), ``"DEO_star"`` (Lemma 1 at
    ``W*``), ``"P^2"``, ``"P log P"}``.  Arguments validated as in :func:`optimal_window`."""
    w_star = optimal_window(n_chains, rejection_rate)
    rates = np.full(n_chains - 1, max(float(rejection_rate), 0.0))
    return {
        "DEO": lemma1_round_trip_time(rates, 1),
        "W_star": float(w_star),
        "DEO_star": lemma1_round_trip_time(rates, w_star),
        "P^2": float(n_chains**2),
        "P log P": float(n_chains * math.log(n_chains)),
    }


# ------------------------------------------- exact event rates of one replica (FixedRate model)
# Each swap on pair (p, p+1) is rejected with probability r_p independently (nrpt.swap.FixedRate;
# Deng et al. 2023 B1-B2; Syed et al. 2021 Thm 1).  A replica's Markov chain per scheme:
# * DEO: state (slot s, k mod 2); at parity q it is in pair (s, s+1) if s % 2 == q, else in
#   (s-1, s) if (s-1) % 2 == q, and moves with probability 1 - r_pair.
# * DEO_W: over a window it moves with probability 1 - r^W and the counters fire only on
#   changes, so its events are DEO's with rejection r_p^W, divided by W per iteration.
# * SEO: state = slot; a fair coin picks the even or odd pairs, then as DEO.
# * ADJ: state = slot; the sweep (0,1), ..., (P-2,P-1): down one with probability 1 - r_{s-1},
#   else P(s -> t) = r_{s-1} prod_{j=s}^{t-1} (1 - r_j) r_t for t >= s (r_{-1} = r_{P-1} = 1).
# * APE: one of the P(P-1)/2 pairs uniformly; a common rate r only.
# The product with the counting automata of .roundtrips is a finite chain; events per iteration
# are stationary expectations (several closed classes: weighted by absorption probabilities).

_SCHEMES = {"adj": "adj", "seo": "seo", "deo": "deo", "deo-w": "deo-w", "deo_w": "deo-w",
            "deow": "deo-w", "ape": "ape"}
_EVENT_KEYS = ("restarts", "round_trips", "round_trips_a5")


def _scheme(scheme, window) -> tuple[str, int]:
    """Normalise a scheme name (``adj``, ``seo``, ``deo``, ``deo-w``/``DEO_W``, ``ape``)."""
    name = _SCHEMES.get(str(scheme).strip().lower()) if isinstance(scheme, str) else None
    if name is None:
        raise ValueError(
            f"scheme must be one of 'adj', 'seo', 'deo', 'deo-w', 'ape'; got {scheme!r}"
        )
    w = _window(window)
    if w != 1 and name != "deo-w":
        raise ValueError(
            f"window applies only to scheme 'deo-w' (DEO_W); scheme {name!r} got window={w}"
        )
    return name, w


def _base_chain(r: np.ndarray, scheme: str):
    """One-iteration transition of a single replica's (slot, clock) state under FixedRate.

    Returns ``(rows, cols, probs, slot_of_state, start_state)``: the nonzero entries of the
    transition matrix, the slot of every state and, for each slot ``s``, the state of a
    replica that starts (iteration ``k = 0``) at ``s``.  DEO's state is ``2 s + (k mod 2)``,
    the other schemes' the slot.
    """
    n = r.size + 1
    rows: list[int] = []
    cols: list[int] = []
    probs: list[float] = []

    def add(i, j, p):
        if p > 0.0:
            rows.append(i)
            cols.append(j)
            probs.append(float(p))

    if scheme not in _CHAINS:  # pragma: no cover - guarded by _scheme
        raise ValueError(f"no single-replica chain for scheme {scheme!r}")
    _CHAINS[scheme](r, n, add)
    if scheme == "deo":
        return rows, cols, probs, np.repeat(np.arange(n), 2), 2 * np.arange(n)
    return rows, cols, probs, np.arange(n), np.arange(n)


def _parity_move(r: np.ndarray, n: int, s: int, q: int) -> tuple[int, float]:
    """(new slot, acceptance prob) of the pair containing slot s among pairs p % 2 == q."""
    if s % 2 == q and s + 1 <= n - 1:
        return s + 1, 1.0 - r[s]
    if s >= 1 and (s - 1) % 2 == q:
        return s - 1, 1.0 - r[s - 1]
    return s, 0.0


def _deo_chain(r: np.ndarray, n: int, add) -> None:
    for s in range(n):
        for q in (0, 1):
            t, a = _parity_move(r, n, s, q)
            add(2 * s + q, 2 * t + 1 - q, a)
            add(2 * s + q, 2 * s + 1 - q, 1.0 - a)


def _seo_chain(r: np.ndarray, n: int, add) -> None:
    for s in range(n):
        for q in (0, 1):
            t, a = _parity_move(r, n, s, q)
            add(s, t, 0.5 * a)
            add(s, s, 0.5 * (1.0 - a))


def _adj_chain(r: np.ndarray, n: int, add) -> None:
    for s in range(n):
        if s >= 1:
            add(s, s - 1, 1.0 - r[s - 1])
        climb = r[s - 1] if s >= 1 else 1.0  # P(not moved down)
        for t in range(s, n):
            add(s, t, climb * (r[t] if t < n - 1 else 1.0))
            if t < n - 1:
                climb *= 1.0 - r[t]


def _ape_chain(r: np.ndarray, n: int, add) -> None:
    m = n * (n - 1) // 2
    for s in range(n):
        for t in range(n):
            if t != s:
                add(s, t, (1.0 - r[0]) / m)
        add(s, s, 1.0 - (n - 1) * (1.0 - r[0]) / m)


#: scheme -> ``fill(r, n, add)``: the entries of its single-replica chain (:func:`_base_chain`)
_CHAINS = {"deo": _deo_chain, "seo": _seo_chain, "adj": _adj_chain, "ape": _ape_chain}


def _syed_automaton(n: int):
    """Tables ``next[a, y]`` and events ``{key: ev[a, y]}`` of the Syed et al. (2021) counter.

    Phases ``a``: 0 = NONE, 1 = AT_TOP_SIDE, 2 = DOWN_DONE (see :mod:`.roundtrips`); ``y`` is
    the slot at the end of the iteration.
    """
    top = n - 1
    nxt = np.repeat(np.arange(3)[:, None], n, axis=1)
    restart = np.zeros((3, n))
    trip = np.zeros((3, n))
    nxt[:, top] = 1
    trip[2, top] = 1.0
    nxt[1:, 0] = 2  # NONE stays NONE at slot 0
    restart[1, 0] = 1.0
    return nxt, {"restarts": restart, "round_trips": trip}


def _a5_automaton(n: int, origin: int):
    """Deng et al. (2023, App. A.5) counter of a replica with origin ``origin``.

    State ``2 hit0 + hit_top``; a trip completes at the origin once both ends were hit, then
    the flags are cleared except the flag of the end the origin lies on.
    """
    top = n - 1
    nxt = np.zeros((4, n), dtype=np.int64)
    done = np.zeros((4, n))
    reset = 2 * (origin == 0) + (origin == top)
    for a in range(4):
        for y in range(n):
            h0, ht = bool(a & 2) or y == 0, bool(a & 1) or y == top
            if h0 and ht and y == origin:
                done[a, y] = 1.0
                nxt[a, y] = reset
            else:
                nxt[a, y] = 2 * h0 + ht
    return nxt, {"round_trips_a5": done}, reset


#: chains with at most this many states are solved densely (NumPy), larger ones sparse (SciPy)
DENSE_STATES = 320


def _augment(base, nxt: np.ndarray, events: dict[str, np.ndarray]):
    """Product of the base chain with a counting automaton: transition matrix and rewards
    (dense array up to :data:`DENSE_STATES` states, SciPy CSR above)."""
    rows, cols, probs, slot_of_state, _ = base
    i = np.asarray(rows, dtype=np.int64)
    j = np.asarray(cols, dtype=np.int64)
    p = np.asarray(probs, dtype=float)
    n_a = nxt.shape[0]
    n_states = slot_of_state.size * n_a
    a = np.arange(n_a)
    y = slot_of_state[j]  # slot after the step, per base transition
    aug_rows = (i[:, None] * n_a + a[None, :]).ravel()
    aug_cols = (j[:, None] * n_a + nxt[:, y].T).ravel()
    aug_p = np.repeat(p, n_a)
    if n_states <= DENSE_STATES:
        matrix = np.zeros((n_states, n_states))
        np.add.at(matrix, (aug_rows, aug_cols), aug_p)  # duplicates add, as in CSR
    else:
        from scipy import sparse

        matrix = sparse.csr_matrix((aug_p, (aug_rows, aug_cols)), shape=(n_states, n_states))
    rewards = {
        key: np.bincount(aug_rows, weights=aug_p * ev[:, y].T.ravel(), minlength=n_states)
        for key, ev in events.items()
    }
    return matrix, rewards



def _long_run(matrix, unichain: bool):
    """The Cesàro-limit solver for ``matrix``: dense (NumPy only) or sparse (SciPy).

    ``unichain``: the caller knows the chain has a single closed class (every
    ``0 < r_p < 1``), so the dense solver skips finding the classes.
    """
    if isinstance(matrix, np.ndarray):
        return _DenseLongRun(matrix, unichain)
    return _SparseLongRun(matrix)


def _stationary_of(block: np.ndarray) -> np.ndarray:
    """Stationary law of a closed class: ``pi (T_C - I) = 0``, last equation ``sum(pi) = 1``."""
    if block.shape[0] == 1:
        return np.ones(1)
    a = block.T - np.eye(block.shape[0])
    a[-1, :] = 1.0
    b = np.zeros(block.shape[0])
    b[-1] = 1.0
    return np.linalg.solve(a, b)


class _DenseLongRun:
    """Cesàro limits ``lim_K (1/K) sum_k E[g(X_k)]`` of a small finite chain (dense arrays).

    Recurrent states and closed classes from the transitive closure of the graph; a
    ``unichain`` chain is solved once for its stationary law."""

    def __init__(self, matrix: np.ndarray, unichain: bool = False) -> None:
        self.m = matrix
        self.pi = None
        if unichain:
            try:
                self.pi = _stationary_of(matrix)
                return
            except np.linalg.LinAlgError:  # (singular: not one closed class after all)
                pass
        n = matrix.shape[0]
        reach = (matrix > 0) | np.eye(n, dtype=bool)
        while True:
            r32 = reach.astype(np.float32)  # path counts stay exact: only > 0 matters
            wider = (r32 @ r32) > 0
            if np.array_equal(wider, reach):
                break
            reach = wider
        self.reach = reach
        self.recurrent = ~np.any(reach & ~reach.T, axis=1)

    def average(self, start: int, rewards: dict[str, np.ndarray]) -> dict[str, float]:
        if self.pi is not None:
            return {key: float(self.pi @ g) for key, g in rewards.items()}
        reached = self.reach[start]
        classes: list[np.ndarray] = []
        seen = np.zeros(reached.size, dtype=bool)
        for s in np.flatnonzero(reached & self.recurrent):
            if not seen[s]:
                idx = np.flatnonzero(self.reach[s])
                seen[idx] = True
                classes.append(idx)
        if len(classes) == 1:
            weights = [1.0]
        else:  # absorption probabilities into each closed class (start is transient)
            trans = np.flatnonzero(reached & ~self.recurrent)
            pos = int(np.searchsorted(trans, start))
            lhs = np.eye(trans.size) - self.m[np.ix_(trans, trans)]
            rhs = np.stack([self.m[np.ix_(trans, idx)].sum(axis=1) for idx in classes], axis=1)
            weights = [float(v) for v in np.linalg.solve(lhs, rhs)[pos]]
        out = dict.fromkeys(rewards, 0.0)
        for w, idx in zip(weights, classes, strict=True):
            pi = _stationary_of(self.m[np.ix_(idx, idx)])
            for key, g in rewards.items():
                out[key] += w * float(pi @ g[idx])
        return out


class _SparseLongRun:
    """The same limits as :class:`_DenseLongRun` for large chains (SciPy sparse solves)."""

    def __init__(self, matrix) -> None:
        from scipy.sparse import csgraph

        self.m = matrix
        n_comp, labels = csgraph.connected_components(matrix, directed=True, connection="strong")
        coo = matrix.tocoo()
        leaves = labels[coo.row] != labels[coo.col]
        open_comp = np.zeros(n_comp, dtype=bool)
        open_comp[labels[coo.row[leaves]]] = True
        self.labels = labels
        self.closed = [c for c in range(n_comp) if not open_comp[c]]
        self._pi: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _stationary(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        from scipy import sparse
        from scipy.sparse.linalg import spsolve

        if c not in self._pi:
            idx = np.flatnonzero(self.labels == c)
            if idx.size == 1:
                pi = np.ones(1)
            else:  # pi (T_C - I) = 0, sum(pi) = 1 (last balance equation replaced)
                a = (self.m[idx][:, idx].T - sparse.identity(idx.size, format="csr")).tolil()
                a[idx.size - 1, :] = np.ones(idx.size)
                b = np.zeros(idx.size)
                b[-1] = 1.0
                pi = np.atleast_1d(spsolve(a.tocsc(), b))
            self._pi[c] = (idx, pi)
        return self._pi[c]

    def average(self, start: int, rewards: dict[str, np.ndarray]) -> dict[str, float]:
        from scipy import sparse
        from scipy.sparse import csgraph
        from scipy.sparse.linalg import spsolve

        reach = csgraph.breadth_first_order(self.m, start, directed=True,
                                            return_predecessors=False)
        classes = sorted({int(c) for c in self.labels[reach]} & set(self.closed))
        if len(classes) == 1:
            weights = {classes[0]: 1.0}
        else:  # absorption probabilities into each closed class (start is transient)
            in_closed = np.isin(self.labels[reach], classes)
            trans = np.sort(reach[~in_closed])
            pos = int(np.searchsorted(trans, start))
            q = self.m[trans][:, trans]
            lhs = (sparse.identity(trans.size, format="csr") - q).tocsc()
            weights = {}
            for c in classes:
                cols = np.flatnonzero(self.labels == c)
                b = np.asarray(self.m[trans][:, cols].sum(axis=1)).ravel()
                weights[c] = float(np.atleast_1d(spsolve(lhs, b))[pos])
        out = dict.fromkeys(rewards, 0.0)
        for c, w in weights.items():
            idx, pi = self._stationary(c)
            for key, g in rewards.items():
                out[key] += w * float(pi @ g[idx])
        return out


def exact_event_rates(
    rejection: Sequence[float] | np.ndarray, scheme: str, window: int = 1, *,
    a5_only: bool = False,
) -> dict[str, float]:
    """Exact long-run restart and round-trip rates of ``scheme`` under independent rejections.

    Model: each swap on pair ``(p, p+1)`` is rejected with probability ``r_p`` independently
    (:class:`nrpt.swap.FixedRate`; assumptions B1-B2 of Deng et al. 2023, App. B; Syed et al.
    2021, Theorem 1).  A replica's slot and the scheme's clock form a finite Markov chain, taken
    in product with the counters of :mod:`nrpt.diagnostics.roundtrips`; rates come from its
    stationary law.  Replica ``i`` starts at slot ``i`` at ``k = 0``; results sum over the ``P``
    replicas.

    Args:
        rejection: the ``P - 1`` rates ``r_p`` in ``[0, 1]``.
        scheme: ``"deo"``, ``"deo-w"`` (alias ``"DEO_W"``), ``"seo"``, ``"adj"`` or ``"ape"``
            (APE: a common rate only).
        window: ``W`` of DEO_W (1 for the other schemes).
        a5_only: compute only ``round_trips_a5`` (the others NaN).

    Returns:
        ``{"restarts", "round_trips", "round_trips_a5"}``: expected events per iteration, summed
        over replicas.  ``round_trips`` equals ``restarts`` in the long run; for DEO/DEO_W
        ``restarts`` equals Lemma 1's ``P / E[T]``.

    Raises:
        ValueError: unknown scheme, ``window != 1`` outside DEO_W, APE with unequal rates."""
    name, r, per_step = _index_chain(_rejections(rejection), scheme, window)
    base = _base_chain(r, name)
    unichain = _unichain(r)
    out = dict.fromkeys(_EVENT_KEYS, 0.0)
    if a5_only:
        out.update(restarts=math.nan, round_trips=math.nan)
    else:
        out.update(_syed_rates(base, r.size + 1, unichain))
    out["round_trips_a5"] = _a5_rate(base, r.size + 1, unichain)
    return {key: per_step * v for key, v in out.items()}


def _index_chain(r: np.ndarray, scheme, window) -> tuple[str, np.ndarray, float]:
    """``(scheme of the chain, its rejection rates, iterations per chain step)``: DEO_W is
    DEO with ``r^W`` per window of ``W`` iterations; APE needs a common rate."""
    name, w = _scheme(scheme, window)
    if name == "ape" and np.ptp(r) > 1e-12:
        raise ValueError(
            "rejection: scheme 'ape' swaps non-adjacent pairs, whose rejection rates are not "
            "determined by the P-1 adjacent ones; exact rates are available only for a common "
            f"rate r applied to every pair (FixedRate), got {r.tolist()}"
        )
    if name == "deo-w":
        return "deo", r**w, 1.0 / w
    return name, r, 1.0


def _unichain(r: np.ndarray) -> bool:
    """Whether the index chain has one closed class: every ``0 < r_p < 1`` (read off the
    accept probabilities the chain is built from, ``a = 1 - r_p``)."""
    accept = 1.0 - r
    return bool(np.all((accept > 0.0) & (1.0 - accept > 0.0)))


def _syed_rates(base, n: int, unichain: bool) -> dict[str, float]:
    """Restarts and Syed round trips per chain step, summed over the ``n`` replicas (replica
    ``s`` starts at slot ``s``)."""
    nxt, events = _syed_automaton(n)
    matrix, rewards = _augment(base, nxt, events)
    chain = _long_run(matrix, unichain)
    out = dict.fromkeys(events, 0.0)
    for s in range(n):
        phase0 = 1 if s == n - 1 else 0  # AT_TOP_SIDE if starting at the top, else NONE
        for key, v in chain.average(int(base[4][s]) * 3 + phase0, rewards).items():
            out[key] += v
    return out


def _a5_rate(base, n: int, unichain: bool) -> float:
    """Deng et al. A.5 round trips per chain step, summed over the ``n`` origins."""
    total = 0.0
    for origin in range(n):
        nxt, events, flags0 = _a5_automaton(n, origin)
        matrix, rewards = _augment(base, nxt, events)
        v = _long_run(matrix, unichain).average(int(base[4][origin]) * 4 + flags0, rewards)
        total += v["round_trips_a5"]
    return total
