"""The posteriordb suite as a benchmark: nrpt with default settings against Stan's own NUTS on
posteriordb's reference posteriors (issue 25, item 6).

For every posterior of a posteriordb checkout that has reference draws (default
``../shared/posteriordb`` relative to the repository; a full ``stan-dev/posteriordb`` clone
works too: the loader reads posteriordb's own layout, :class:`Posterior`):

1. the Stan program and its data become a target, ``nrpt.targets.from_stan(program, data)``
   (compiled once and cached; the compile / load time is reported on its own);
2. **nrpt** runs with its defaults, ``nrpt.sample(target, rounds=N, systems=S, seed=s)`` plus
   whatever ``--nrpt-options JSON`` overrides (so the lead can re-run when the defaults change).
   ``N`` is calibrated to ``--budget-s`` from a short pilot (the largest ``N`` whose predicted
   wall time fits), unless the options give ``rounds``.  Slot 0's draws of the last round, one
   chain per system, are mapped to Stan's constrained parameters (``target.model_variables``,
   Stan names like ``beta[1]``);
3. **Stan's NUTS** through the same compiled model (diagonal metric, Stan's default
   adaptation), ``S`` chains, its number of iterations calibrated from a pilot so that the run
   takes nrpt's measured wall time (the same budget);
4. both sets of draws are compared with the reference draws (:func:`compare`): per parameter
   ``z = (mean - mean_ref) / sqrt(mcse^2 + sd_ref^2 / ess_ref)`` with the method's own MCSE
   (ArviZ's ``mcse(method="mean")``, from the bulk ESS over its chains) and the reference's
   (its bulk ESS from posteriordb's info file), and the sd ratio ``sd / sd_ref``.  A method
   passes a posterior when ``max |z| <= 4`` and every sd ratio is in ``[0.9, 1.1]``
   (issue 25's thresholds) on every seed.
   Also per method: bulk ESS (minimum over parameters) per second of wall time, and for nrpt
   log Z (mean over systems; its spread over seeds), the barrier Lambda, the chains used and
   nrpt's own warnings.

The raw numbers go to a JSON file next to the table (``--out docs/posteriordb.md`` ->
``docs/posteriordb.json``); a posterior already in the JSON is skipped unless ``--force`` (one
stored as an error is run again), so a long run can be done in pieces (each finished posterior
is saved at once).  The table is rewritten from the whole JSON after each posterior.

Usage::

    python benchmarks/posteriordb.py --quick                      # 4 small posteriors, minutes
    python benchmarks/posteriordb.py --only garch11 arK --seeds 0 1 --budget-s 60
    python benchmarks/posteriordb.py --nrpt-options '{"explorer": "mala"}' --force
    python benchmarks/posteriordb.py --list                       # what the database holds
    python benchmarks/posteriordb.py --keep-nuts --only arK       # new nrpt, stored NUTS kept
    python benchmarks/posteriordb.py --out /tmp/new/pdb.md --nuts-from docs/posteriordb.json
    python benchmarks/posteriordb.py --only garch11 --log-z-check # + a second reference's log Z

A kept NUTS run (``--keep-nuts``, ``--nuts-from``) had the wall time of the nrpt run it was
first paired with; its ESS/s is a rate and stays comparable, its record says where it came from
(``nuts_kept``).

One torch thread (``OMP_NUM_THREADS=1``); run one benchmark process at a time on a shared
machine.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DB = (REPO / ".." / "shared" / "posteriordb").resolve()
DEFAULT_OUT = REPO / "docs" / "posteriordb.md"

#: issue 25's pass thresholds
MAX_ABS_Z = 4.0
SD_RATIO = (0.9, 1.1)
#: a pass whose smallest bulk ESS is below this is flagged in the table (weak evidence)
MIN_ESS = 100

#: the issue's table, small ones first: the order a run takes them in (the rest follow by name)
PRIORITY = (
    "eight_schools-eight_schools_noncentered",
    "low_dim_gauss_mix-low_dim_gauss_mix",
    "garch-garch11",
    "arK-arK",
    "kidiq-kidscore_interaction",
    "sblrc-blr",
    "mesquite-logmesquite_logvas",
    "gp_pois_regr-gp_pois_regr",
    "diamonds-diamonds",
)
#: issue 25's multimodal posteriors, where nrpt should be ahead of NUTS (with every posterior
#: whose posteriordb keywords say "multimodal")
MULTIMODAL = (
    "bball_drive_event_0-hmm_drive_0",
    "bball_drive_event_1-hmm_drive_1",
    "low_dim_gauss_mix-low_dim_gauss_mix",
)
#: the second normalised reference of ``--log-z-check`` (the default run uses "gaussian")
LOG_Z_CHECK_REFERENCE = "gaussian-fixed"
#: ``--quick``: small, fast posteriors (d <= 10, small data)
QUICK = (
    "eight_schools-eight_schools_noncentered",
    "garch-garch11",
    "arK-arK",
    "low_dim_gauss_mix-low_dim_gauss_mix",
)


# --------------------------------------------------------------------------------------------
# posteriordb's layout
# --------------------------------------------------------------------------------------------


def database_root(path: str | os.PathLike) -> Path:
    """The ``posterior_database`` folder of a posteriordb checkout (``path`` may be the
    checkout or that folder itself); a clear error when it is neither."""
    p = Path(path).expanduser()
    for cand in (p / "posterior_database", p):
        if (cand / "posteriors").is_dir() and (cand / "models").is_dir():
            return cand
    raise FileNotFoundError(
        f"--db {str(path)!r} is not a posteriordb checkout: expected "
        f"{p / 'posterior_database' / 'posteriors'} (or {p / 'posteriors'}) and models/ beside it")


def _read_zipped_json(path: Path) -> Any:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(".json")]
        if len(names) != 1:
            raise ValueError(f"{path}: expected one .json file inside, found {z.namelist()}")
        return json.loads(z.read(names[0]))


@dataclass
class Posterior:
    """One posteriordb posterior: its metadata (``posteriors/NAME.json``) and paths to its Stan
    program, data and reference draws."""

    name: str
    root: Path
    meta: dict = field(repr=False)

    @property
    def model_name(self) -> str:
        return self.meta["model_name"]

    @property
    def data_name(self) -> str | None:
        return self.meta.get("data_name")

    @property
    def keywords(self) -> list[str]:
        return list(self.meta.get("keywords") or [])

    @property
    def dimensions(self) -> dict[str, int]:
        return dict(self.meta.get("dimensions") or {})

    @property
    def dim(self) -> int:
        """The number of scalar parameters (constrained), from the metadata."""
        return int(sum(self.dimensions.values()))

    @property
    def reference_name(self) -> str | None:
        return self.meta.get("reference_posterior_name")

    @property
    def program_path(self) -> Path:
        return self.root / "models" / "stan" / f"{self.model_name}.stan"

    @property
    def data_path(self) -> Path | None:
        if not self.data_name:
            return None
        return self.root / "data" / "data" / f"{self.data_name}.json.zip"

    @property
    def draws_path(self) -> Path | None:
        if not self.reference_name:
            return None
        return (self.root / "reference_posteriors" / "draws" / "draws"
                / f"{self.reference_name}.json.zip")

    @property
    def info_path(self) -> Path | None:
        if not self.reference_name:
            return None
        return (self.root / "reference_posteriors" / "draws" / "info"
                / f"{self.reference_name}.info.json")

    def has_reference(self) -> bool:
        p = self.draws_path
        return p is not None and p.is_file()

    def program(self) -> str:
        return self.program_path.read_text()

    def data(self) -> dict:
        """The data as a dict (JSON ints stay ints); ``{}`` for a posterior without data."""
        p = self.data_path
        return {} if p is None else _read_zipped_json(p)

    def reference(self) -> dict[str, np.ndarray]:
        """The reference draws: Stan name -> ``[chains, draws]`` (10 x 1000 in posteriordb)."""
        if not self.has_reference():
            raise FileNotFoundError(f"{self.name}: no reference draws ({self.draws_path})")
        chains = _read_zipped_json(self.draws_path)
        names = list(chains[0])
        for c in chains[1:]:
            if list(c) != names:
                raise ValueError(f"{self.name}: reference chains name different parameters")
        return {n: np.asarray([c[n] for c in chains], dtype=np.float64) for n in names}

    def info(self) -> dict:
        p = self.info_path
        return json.loads(p.read_text()) if p is not None and p.is_file() else {}

    def reference_ess(self) -> dict[str, float]:
        """Bulk ESS of each reference parameter, from the info file (``{}`` if it has none)."""
        diag = self.info().get("diagnostics") or {}
        names = (diag.get("diagnostic_information") or {}).get("names") or []
        ess = diag.get("effective_sample_size_bulk") or []
        return {n: float(e) for n, e in zip(names, ess, strict=False)} if len(names) == len(ess) \
            else {}


def load_posterior(db: str | os.PathLike, name: str) -> Posterior:
    root = database_root(db)
    path = root / "posteriors" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"posterior {name!r} not in {root / 'posteriors'}")
    return Posterior(name=name, root=root, meta=json.loads(path.read_text()))


def list_posteriors(db: str | os.PathLike, *, with_reference: bool = True) -> list[str]:
    """The posteriors of ``db`` (those with reference draws by default), the issue's table first,
    then by name."""
    root = database_root(db)
    names = sorted(p.name[:-len(".json")] for p in (root / "posteriors").glob("*.json"))
    if with_reference:
        names = [n for n in names if load_posterior(root, n).has_reference()]
    first = [n for n in PRIORITY if n in names]
    return first + [n for n in names if n not in first]


def select(names: list[str], only: list[str] | None) -> list[str]:
    """``names`` narrowed to ``only`` (each a posterior name, or its model or data name, e.g.
    ``garch11`` for ``garch-garch11``); a word matching nothing is an error naming the choices."""
    if not only:
        return names
    chosen: list[str] = []
    for word in only:
        hits = [n for n in names if word == n or word in n.split("-", 1)]
        if not hits:
            raise SystemExit(f"--only: {word!r} matches no posterior with reference draws; "
                             f"choose from: {', '.join(names)}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


def stan_names(variables: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """Constrained model variables ``{var: [n, *shape]}`` as Stan's scalar names
    ``{"var[i,j]": [n]}`` (1-based; a flat dict already in Stan names passes through)."""
    out: dict[str, np.ndarray] = {}
    for var, value in variables.items():
        a = np.asarray(value, dtype=np.float64)
        if a.shape[:1] != (n,):
            raise ValueError(f"model variable {var!r} has shape {a.shape}; expected [{n}, ...]")
        if a.ndim == 1:
            out[var] = a
            continue
        for idx in np.ndindex(*a.shape[1:]):
            out[f"{var}[{','.join(str(i + 1) for i in idx)}]"] = a[(slice(None), *idx)]
    return out


def _ess_mcse(chains: np.ndarray) -> tuple[float, float]:
    """(bulk ESS, MCSE of the mean) of ``[chains, draws]`` by ArviZ."""
    import arviz as az

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ess = float(np.ravel(az.ess(chains, method="bulk"))[0])
        mcse = float(np.ravel(az.mcse(chains, method="mean"))[0])
    return ess, mcse


def compare(draws: dict[str, np.ndarray], reference: dict[str, np.ndarray],
            reference_ess: dict[str, float] | None = None) -> dict[str, Any]:
    """A method's draws ``{name: [chains, n]}`` against the reference's: per-parameter mean,
    sd, bulk ESS, MCSE, z and sd ratio, and the summary (max |z|, sd-ratio range, min bulk
    ESS, pass).  ``z`` divides by ``sqrt(mcse^2 + sd_ref^2 / ess_ref)``; ``ess_ref`` is the
    reference's bulk ESS (``reference_ess``, else ArviZ's on the reference draws).  Every
    reference parameter must be in ``draws``."""
    missing = [n for n in reference if n not in draws]
    if missing:
        raise ValueError(f"the draws lack reference parameters {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''} (have {list(draws)[:8]} ...)")
    reference_ess = reference_ess or {}
    params = {}
    for name, ref in reference.items():
        x = np.asarray(draws[name], dtype=np.float64)
        if x.ndim == 1:
            x = x[None]
        ess, mcse = _ess_mcse(x)
        ref_mean, ref_sd = float(ref.mean()), float(ref.std(ddof=1))
        ref_ess = reference_ess.get(name)
        if ref_ess is None or not math.isfinite(ref_ess) or ref_ess <= 0:
            ref_ess = _ess_mcse(ref)[0]
        mean, sd = float(x.mean()), float(x.std(ddof=1))
        se = math.sqrt(mcse ** 2 + ref_sd ** 2 / ref_ess) if math.isfinite(mcse) else math.nan
        if not math.isfinite(mean) or not math.isfinite(se):
            z = math.inf
        elif se > 0:
            z = (mean - ref_mean) / se
        else:  # a constant parameter, both sides
            z = 0.0 if mean == ref_mean else math.inf
        ratio = sd / ref_sd if ref_sd > 0 else (1.0 if sd == 0 else math.inf)
        params[name] = {"mean": mean, "sd": sd, "ess_bulk": ess, "mcse_mean": mcse,
                        "ref_mean": ref_mean, "ref_sd": ref_sd, "ref_ess_bulk": ref_ess,
                        "z": z, "sd_ratio": ratio}
    zs = [abs(p["z"]) if math.isfinite(p["z"]) else math.inf for p in params.values()]
    ratios = [p["sd_ratio"] for p in params.values()]
    esses = [p["ess_bulk"] if math.isfinite(p["ess_bulk"]) else 0.0 for p in params.values()]
    worst = max(params, key=lambda n: abs(params[n]["z"]) if math.isfinite(params[n]["z"])
                else math.inf)
    max_z = max(zs)
    passed = bool(max_z <= MAX_ABS_Z
                  and all(SD_RATIO[0] <= r <= SD_RATIO[1] for r in ratios))
    return {"max_abs_z": max_z, "worst": worst, "sd_ratio_min": min(ratios),
            "sd_ratio_max": max(ratios), "ess_bulk_min": min(esses), "pass": passed,
            "n_chains": int(np.atleast_2d(draws[worst]).shape[0]),
            "n_draws": int(np.atleast_2d(draws[worst]).shape[1]),
            "params": params}


# --------------------------------------------------------------------------------------------
# the two methods
# --------------------------------------------------------------------------------------------


def _quiet_sample(target, **options):
    import nrpt

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = nrpt.sample(target, progress=False, **options)
    return res, [str(w.message) for w in caught]


def nrpt_draws(target, samples: np.ndarray) -> dict[str, np.ndarray]:
    """Slot-0 draws ``[R, n, dim]`` (unconstrained) -> ``{Stan name: [R, n]}`` constrained."""
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim == 2:
        s = s[None]
    per = [stan_names(target.model_variables(s[r]), s.shape[1]) for r in range(s.shape[0])]
    return {n: np.stack([p[n] for p in per]) for n in per[0]}


def _iterations(rounds: int) -> int:
    return 2 ** (rounds + 1) - 2


#: explorers that can change kernel between rounds (``mala-hmc``: MALA, then HMC at ~10
#: gradients a step), so a pilot that ends before the switch under-prices the later rounds
SWITCHING = ("mala-hmc",)
#: ... their pilot (a switch after it: the run is re-run with the rounds its own round times
#: fit in the budget, :func:`rounds_within`; the first run kept as ``recalibrated_from``):
#: the switch can fire first after round 5 (``NECK_MIN_STEPS`` = 128 slot-0
#: steps: 32 iterations x 4 systems) and never after a run's last round, so a pilot of 7
#: rounds sees a switch after round 5 or 6 and times its last round with the switched kernel
SWITCH_PILOT_ROUNDS = 7


def pilot_rounds_for(target, options: dict, min_rounds: int = 6) -> int:
    """The pilot's rounds: ``min_rounds``, or :data:`SWITCH_PILOT_ROUNDS` where the run's
    explorer (``options``' or the target's default) is one of :data:`SWITCHING`."""
    explorer = options.get("explorer",
                           (getattr(target, "default_settings", None) or {}).get("explorer"))
    return max(min_rounds, SWITCH_PILOT_ROUNDS) if explorer in SWITCHING else min_rounds


def calibrate_rounds(target, budget_s: float, options: dict, *, pilot_rounds: int = 6,
                     max_rounds: int = 16, min_rounds: int = 6) -> tuple[int, float, Any]:
    """The largest number of rounds whose predicted wall time fits ``budget_s``: a pilot of
    ``pilot_rounds`` rounds, then each further iteration at the pilot's last-round seconds per
    iteration (earlier rounds carry the per-round adaptation's fixed cost; a switched
    explorer's last round is priced at its new kernel, :func:`pilot_rounds_for`); (rounds,
    pilot s, the pilot's (result, warnings): the run itself when rounds = ``pilot_rounds``,
    never fewer: its time is spent)."""
    opts = {k: v for k, v in options.items() if k != "rounds"}
    t0 = time.perf_counter()
    got = _quiet_sample(target, rounds=pilot_rounds, **opts)
    res = got[0]
    pilot = time.perf_counter() - t0
    last = (res.summary.get("round_rows") or [{}])[-1]
    if last.get("wall_s") and last.get("iterations"):
        per_iter = float(last["wall_s"]) / float(last["iterations"])
    else:
        per_iter = pilot / _iterations(pilot_rounds)
    rounds = max(min_rounds, pilot_rounds)
    while rounds < max_rounds and (pilot + per_iter * (_iterations(rounds + 1)
                                                       - _iterations(pilot_rounds))) <= budget_s:
        rounds += 1
    return rounds, pilot, got


def rounds_within(rows: list[dict], budget_s: float, min_rounds: int = 6) -> int:
    """The most rounds whose wall time, as a run's ``round_rows`` measured them (a run of
    fewer rounds repeats the longer run's first rounds: the same seed, the same schedule),
    fits ``budget_s``; at least ``min_rounds``."""
    total, rounds = 0.0, 0
    for row in rows:
        total += float(row.get("wall_s") or 0.0)
        if total > budget_s:
            break
        rounds += 1
    return max(min_rounds, rounds)


def run_nrpt(target, *, seed: int, systems: int, budget_s: float, options: dict,
             min_rounds: int = 6, max_rounds: int = 16) -> dict:
    opts = {"systems": systems, **options, "seed": seed}
    pilot, got = None, None
    pilot_rounds = pilot_rounds_for(target, opts, min_rounds)
    if "rounds" not in opts:
        opts["rounds"], pilot, got = calibrate_rounds(target, budget_s, opts,
                                                      pilot_rounds=pilot_rounds,
                                                      min_rounds=min_rounds,
                                                      max_rounds=max_rounds)
    cpu_s = None  # (process CPU seconds of the run; not kept for a pilot reused as the run)
    if got is not None and opts["rounds"] == pilot_rounds:  # the pilot was this very run
        (res, caught), wall = got, pilot
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        res, caught = _quiet_sample(target, **opts)
        wall, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    first = None  # a run priced at MALA's cost that switched after the pilot: re-calibrated
    if (got is not None and wall > budget_s and res.summary.get("explorer_switched")
            and not got[0].summary.get("explorer_switched")):
        fit = rounds_within(res.summary.get("round_rows") or [], budget_s, min_rounds)
        if fit < opts["rounds"]:
            first = {"rounds": opts["rounds"], "wall_s": wall, "cpu_s": cpu_s,
                     "explorer_switched": res.summary.get("explorer_switched")}
            opts["rounds"] = fit
            t0, c0 = time.perf_counter(), time.process_time()
            res, caught = _quiet_sample(target, **opts)
            wall, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary
    log_z = np.atleast_1d(np.asarray(s.get("log_normalizer", np.nan), dtype=np.float64))
    log_z_se = np.atleast_1d(np.asarray(s.get("log_normalizer_se", np.nan), dtype=np.float64))
    barrier = np.atleast_1d(np.asarray(s.get("barrier", np.nan), dtype=np.float64))
    chains = s.get("chains")
    return {"draws": nrpt_draws(target, res.samples), "wall_s": wall, "pilot_s": pilot,
            "options": {k: v for k, v in opts.items()},
            "rounds": s.get("rounds"), "chains": chains, "explorer": s.get("explorer"),
            "path": s.get("path"), "barrier": barrier.tolist(),
            "log_z": log_z.tolist(), "log_z_se": log_z_se.tolist(),
            "log_z_kind": s.get("log_normalizer_kind"),
            "recommended_chains": s.get("recommended_chains"),
            "explorer_switched": s.get("explorer_switched"),
            "pilot_rounds": pilot_rounds if pilot is not None else None,
            "pilot_switched": (None if got is None
                               else got[0].summary.get("explorer_switched")),
            "recalibrated_from": first,
            "cpu_s": cpu_s,
            "warnings": list(dict.fromkeys(list(s.get("warnings") or []) + caught))}


def _bracket(name: str) -> str:
    """Stan's CSV column name -> its bracket name: ``theta.1`` -> ``theta[1]``,
    ``a.1.2`` -> ``a[1,2]`` (other names unchanged)."""
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_]*)((?:\.\d+)+)", name)
    return f"{m.group(1)}[{m.group(2)[1:].replace('.', ',')}]" if m else name


def stan_nuts(target, *, chains: int, warmup: int, draws: int, seed: int,
              max_seconds: float | None = None) -> tuple[dict, float, dict]:
    """Stan's NUTS on the target's compiled model (``target.nuts``, lane A's bridge):
    ({Stan name: [chains, draws]}, wall s, sampler diagnostics); ``max_seconds``: the bridge's
    time cap for the whole call (``max_seconds / chains`` per chain)."""
    nuts = getattr(target, "nuts", None)
    if nuts is None:
        raise RuntimeError(f"{type(target).__name__} has no nuts() (Stan's NUTS comes with "
                           f"nrpt.targets.from_stan's bridge)")
    cap = {} if max_seconds is None else {"max_seconds": float(max_seconds)}
    t0 = time.perf_counter()
    out = nuts(chains=chains, warmup=warmup, draws=draws, seed=seed, **cap)
    wall = time.perf_counter() - t0
    got = out["draws"] if isinstance(out, dict) and "draws" in out else out
    res, diag = {}, {}
    for name, v in got.items():
        a = np.asarray(v, dtype=np.float64)
        if name.endswith("__"):
            diag[name] = a
        elif a.ndim == 2:
            res[_bracket(name)] = a
        else:  # {variable: [chains, draws, *shape]}
            for idx in np.ndindex(*a.shape[2:]):
                res[f"{name}[{','.join(str(i + 1) for i in idx)}]"] = a[(slice(None),
                                                                         slice(None), *idx)]
    info = {}
    if "divergent__" in diag:
        info["divergences"] = int(diag["divergent__"].sum())
    if "stepsize__" in diag:
        info["step_size"] = [float(c[-1]) if c.size else math.nan
                             for c in diag["stepsize__"]]
    if "n_leapfrog__" in diag:
        info["mean_leapfrog"] = (float(diag["n_leapfrog__"].mean())
                                 if diag["n_leapfrog__"].size else math.nan)
    if isinstance(out, dict) and "stopped" in out:
        info["stopped"] = [bool(b) for b in out["stopped"]]
    return res, wall, info


#: NUTS's run is stopped at this many times its budget (nrpt's wall time; a one-chain pilot
#: can misjudge the adapted chains' cost by 7x, e.g. earnings), or at twice the pilot's
#: estimate of the smallest run if that is longer; a chain stopped in warm-up leaves no draws,
#: and the run is scored as a failure at this budget
NUTS_TIME_CAP = 3.0


def run_nuts(target, *, seed: int, chains: int, budget_s: float, pilot: tuple[int, int] = (100, 50),
             min_draws: int = 100, max_iter: int = 100_000,
             time_cap: float | None = NUTS_TIME_CAP) -> dict:
    """NUTS with ``chains`` chains (run one after another) for about ``budget_s`` seconds: a
    one-chain pilot (``pilot`` warm-up and draws) gives the seconds per iteration; warm-up =
    draws = half of what the budget allows (at least 150 warm-up and ``min_draws`` draws, at
    most ``max_iter`` iterations per chain); the run is stopped at ``time_cap`` times the
    budget (None: never)."""
    _, pilot_wall, _ = stan_nuts(target, chains=1, warmup=pilot[0], draws=pilot[1],
                                 seed=seed + 10_000)
    per_iter = pilot_wall / sum(pilot)
    total = int(budget_s / max(per_iter, 1e-9) / chains)
    total = max(150 + min_draws, min(total, max_iter))
    warmup = max(150, total // 2)
    draws = max(min_draws, total - warmup)
    # the cap: time_cap x the budget, but never below twice the pilot's estimate of the
    # smallest run allowed (150 warm-up + min_draws per chain)
    cap = None if time_cap is None else max(time_cap * budget_s,
                                            2.0 * per_iter * chains * (150 + min_draws))
    got, wall, info = stan_nuts(target, chains=chains, warmup=warmup, draws=draws, seed=seed,
                                max_seconds=cap)
    return {"draws": got, "wall_s": wall, "pilot_s": pilot_wall, "warmup": warmup,
            "iterations": draws, "chains": chains, "time_cap_s": cap, **info}


# --------------------------------------------------------------------------------------------
# one posterior
# --------------------------------------------------------------------------------------------


def make_target(post: Posterior):
    """``nrpt.targets.from_stan`` on the posterior's program and data; (target, seconds)."""
    from nrpt.targets import from_stan

    t0 = time.perf_counter()
    target = from_stan(post.program_path, post.data())
    return target, time.perf_counter() - t0


def _scored(r: dict, seed: int, reference, ref_ess) -> dict:
    """One method's run record with its comparison to the reference draws (the draws dropped)
    and ESS per second."""
    draws = r.pop("draws")
    n = min((np.atleast_2d(v).shape[-1] for v in draws.values()), default=0)
    if n < 4:  # NUTS stopped by its time cap in warm-up: no draws to compare
        r.update({"max_abs_z": math.inf, "worst": "", "sd_ratio_min": math.nan,
                  "sd_ratio_max": math.nan, "ess_bulk_min": 0.0, "pass": False,
                  "n_draws": n, "note": f"{n} draws (stopped by the time cap in warm-up)"})
        r["seed"], r["ess_per_s"] = seed, 0.0
        return r
    cmp = compare(draws, reference, ref_ess)
    r.update(_strip(cmp))
    r["seed"] = seed
    r["ess_per_s"] = cmp["ess_bulk_min"] / r["wall_s"]
    return r


def _verdict(r: dict) -> str:
    return (f"{'pass' if r['pass'] else 'FAIL'} max|z| {r['max_abs_z']:.2f} ({r['worst']}), "
            f"sd ratio [{r['sd_ratio_min']:.3f}, {r['sd_ratio_max']:.3f}], ESS/s "
            f"{r['ess_per_s']:.2f}, {r['wall_s']:.1f} s")


def _strip(cmp: dict) -> dict:
    """``compare``'s result without the bulky per-parameter table (kept for the worst one)."""
    out = {k: v for k, v in cmp.items() if k != "params"}
    out["worst_param"] = cmp["params"][cmp["worst"]]
    return out


def run_posterior(post: Posterior, *, seeds: list[int], systems: int, budget_s: float,
                  options: dict, nuts: bool = True, target_factory=make_target,
                  log=print) -> dict:
    """nrpt (and NUTS) on one posterior for each seed, compared with the reference draws."""
    reference = post.reference()
    ref_ess = post.reference_ess()
    target, load_s = target_factory(post)
    log(f"  {post.name}: target ready in {load_s:.1f} s (dim {target.dim})")
    record: dict[str, Any] = {"name": post.name, "dim": int(target.dim),
                              "n_reference_params": len(reference), "load_s": load_s,
                              "keywords": post.keywords, "nrpt": [], "nuts": []}
    for seed in seeds:
        r = _scored(run_nrpt(target, seed=seed, systems=systems, budget_s=budget_s,
                             options=options), seed, reference, ref_ess)
        record["nrpt"].append(r)
        log(f"    nrpt seed {seed}: {_verdict(r)}, rounds {r['rounds']}, chains {r['chains']}, "
            f"barrier {np.nanmean(r['barrier']):.2f}")
        if nuts:
            n = _scored(run_nuts(target, seed=seed, chains=systems, budget_s=r["wall_s"]), seed,
                        reference, ref_ess)
            record["nuts"].append(n)
            log(f"    NUTS seed {seed}: {_verdict(n)}, {n['warmup']}+{n['iterations']} "
                f"iterations")
    return record


def run_log_z_check(post: Posterior, *, seeds: list[int], systems: int, budget_s: float,
                    options: dict, reference: str = LOG_Z_CHECK_REFERENCE,
                    check_options: dict | None = None, target_factory=make_target,
                    log=print) -> dict:
    """nrpt with a second normalised reference (``reference``, by default the fixed broad
    Gaussian) for each seed: an independent estimate of the same log Z as the default run's
    (both references are normalised, so both estimate log Z of Stan's density on the
    unconstrained space); each run scored against the reference draws like the default one.
    ``check_options``: nrpt settings for the check's runs only, over ``options`` (e.g.
    ``{"chains": 32, "rounds": 11}``).  The fixed broad reference's path has a far larger
    barrier than the refitted one's (kidscore_mom_work: Λ ≈ 15.5 measured with 40 chains,
    against 0.35), and a ladder too short for it makes the bridge read low with an error too
    small (docs/posteriordb.md, "log Z"); ``chains = "auto"`` cannot grow this reference's
    ladder, so the check takes a fixed count, and a longer ladder at the same budget leaves too
    few rounds for the explorer's adaptation unless ``rounds`` is given too."""
    reference_draws, ref_ess = post.reference(), post.reference_ess()
    target, _ = target_factory(post)
    runs = []
    for seed in seeds:
        r = _scored(run_nrpt(target, seed=seed, systems=systems, budget_s=budget_s,
                             options={**options, "reference": reference,
                                      **(check_options or {})}),
                    seed, reference_draws, ref_ess)
        runs.append(r)
        log(f"    nrpt reference={reference} seed {seed}: {_verdict(r)}, log Z "
            f"{_log_z_of(r)[0]:.3f} +- {_log_z_of(r)[1]:.3f}")
    return {"reference": reference, "runs": runs}


def _log_z_of(run: dict, error: str = "se") -> tuple[float, float, float]:
    """(mean of the systems' log Z, its error, the sd of the systems' estimates over the rms of
    their reported errors: about 1 when the reported errors are honest).  ``error``: "se", nrpt's
    pooled error (:func:`nrpt.recorders.log_z.pooled_log_z`: the larger of the batch-means
    error sqrt(sum se_i^2) / R and the systems' spread's sd / sqrt(R)); "within_se", the
    batch-means error alone (what this table reported before)."""
    from nrpt.recorders.log_z import pooled_log_z

    lz = np.asarray([_num(v) for v in run.get("log_z", [])], dtype=np.float64)
    se = np.asarray([_num(v) for v in run.get("log_z_se", [])], dtype=np.float64)
    if lz.size == 0:
        return math.nan, math.nan, math.nan
    pooled = pooled_log_z(lz, se if se.size == lz.size else np.full(lz.size, np.nan))
    mean, err = pooled["estimate"], pooled[error]
    spread = (float(np.std(lz, ddof=1) / np.sqrt(np.mean(se ** 2)))
              if lz.size > 1 and se.size == lz.size and np.all(se > 0) else math.nan)
    return mean, err, spread


#: nrpt's log Z findings, by a phrase of their message (the runs keep the messages only;
#: "halves": stored runs' "... disagree" and, since the halves warn only in the wrong order,
#: "... are in the wrong order")
LOG_Z_WARNINGS = {"overlap": "overlap too little for the log Z bridge",
                  "halves": "the stepping-stone halves of log Z ",
                  "systems": "log Z estimates"}


def _log_z_warnings(runs: list[dict]) -> list[str]:
    """The kinds of log Z findings nrpt raised in any of ``runs`` (:data:`LOG_Z_WARNINGS`)."""
    return [k for k, phrase in LOG_Z_WARNINGS.items()
            if any(phrase in w for r in runs for w in r.get("warnings", []))]


def _z(a: tuple, b: tuple) -> float:
    """z of the difference of two (estimate, error) pairs."""
    den = math.hypot(a[1], b[1])
    return (a[0] - b[0]) / den if den > 0 else (0.0 if a[0] == b[0] else math.inf)


def log_z_agreement(rec: dict) -> dict[str, Any] | None:
    """Does log Z agree between the two references and between seeds within the reported
    error?  From the default run (``rec["nrpt"]``, reference "gaussian") and the
    ``--log-z-check`` run (``rec["log_z_check"]``): per reference, per seed (estimate, error);
    max |z| between seeds for each reference, max |z| between the references over the seeds
    they share, the largest systems-spread / reported-error ratio; ``agree`` when every |z|
    <= :data:`MAX_ABS_Z`.  None when the posterior has no check run."""
    check = rec.get("log_z_check")
    if not check or not check.get("runs"):
        return None
    if any(r.get("log_z_kind") not in (None, "log Z")
           for r in rec.get("nrpt", []) + check["runs"]):
        return {"note": "a log Z ratio (not a normalised reference): not comparable"}
    def z_of(error: str) -> tuple[dict, dict[str, float]]:
        sides = {"gaussian": {r["seed"]: _log_z_of(r, error) for r in rec.get("nrpt", [])},
                 check["reference"]: {r["seed"]: _log_z_of(r, error) for r in check["runs"]}}
        zs: dict[str, float] = {}
        for ref, per in sides.items():
            seeds = sorted(per)
            zs[f"z_seeds[{ref}]"] = max_abs(_z(per[a], per[b]) for i, a in enumerate(seeds)
                                            for b in seeds[i + 1:])
        a, b = sides.values()
        zs["z_references"] = max_abs(_z(a[s], b[s]) for s in a if s in b)
        return sides, zs

    def max_abs(zs):
        zs = [abs(z) for z in zs if not math.isnan(z)]
        return max(zs) if zs else math.nan

    def agree(zs):
        return bool(all(not math.isnan(z) and z <= MAX_ABS_Z for z in zs.values()))

    sides, zs = z_of("se")
    out: dict[str, Any] = {"references": list(sides), "estimates": sides, **zs}
    out["spread_ratio"] = max_abs(v[2] for per in sides.values() for v in per.values())
    out["agree"] = agree(zs)
    out["warned"] = {"gaussian": _log_z_warnings(rec.get("nrpt", [])),
                     check["reference"]: _log_z_warnings(check["runs"])}
    # the same check with the batch-means errors alone (the error this table used before the
    # pooled error took the systems' spread into account)
    within_sides, within_zs = z_of("within_se")
    out["within"] = {"estimates": within_sides, **within_zs, "agree": agree(within_zs)}
    return out


def log_z_table(results: dict) -> str:
    """The log Z agreement table over the posteriors that have a ``--log-z-check`` run."""
    rows = []
    for name, rec in results.get("posteriors", {}).items():
        agr = log_z_agreement(rec)
        if agr is None:
            continue
        if "note" in agr:
            rows.append(f"| {name} | {agr['note']} |" + " |" * 8)
            continue
        ref_a, ref_b = agr["references"]

        def cell(ref, agr=agr):
            per = agr["estimates"][ref]
            return "; ".join(f"{per[s][0]:.2f} ± {per[s][1]:.2f}" for s in sorted(per))

        within = agr["within"]
        old_z = max(within[k] for k in within if k.startswith("z_"))
        rows.append(f"| {name} | {cell(ref_a)} | {cell(ref_b)} | "
                    f"{_f(agr[f'z_seeds[{ref_a}]'])} | {_f(agr[f'z_seeds[{ref_b}]'])} | "
                    f"{_f(agr['z_references'])} | {_f(agr['spread_ratio'])} | "
                    f"{'yes' if agr['agree'] else '**no**'} | {_f(old_z)} "
                    f"({'yes' if within['agree'] else 'no'}) | "
                    + "; ".join(f"{ref}: {', '.join(w)}" for ref, w in agr["warned"].items()
                                if w) + " |")
    if not rows:
        return ""
    check = next(r["log_z_check"]["reference"] for r in results["posteriors"].values()
                 if r.get("log_z_check"))
    head = (f"| posterior | log Z, gaussian (seeds) | log Z, {check} (seeds) | "
            f"max \\|z\\| seeds, gaussian | max \\|z\\| seeds, {check} | "
            "max \\|z\\| references | systems sd / batch-means se | agree | "
            "max \\|z\\| with batch-means errors only (agree) | nrpt's log Z warnings |\n"
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    return "\n".join([head, *rows])


# --------------------------------------------------------------------------------------------
# the JSON and the table
# --------------------------------------------------------------------------------------------


def _finite(x):
    """JSON-safe: non-finite floats as strings (``"inf"``, ``"nan"``)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if isinstance(x, np.generic):
        return _finite(x.item())
    return x


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def load_results(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"meta": {}, "posteriors": {}}


def save_results(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(results), indent=1) + "\n")
    os.replace(tmp, path)


def summarize(runs: list[dict]) -> dict[str, Any]:
    """One method's seeds on one posterior: worst max |z|, sd-ratio range, pass on every seed,
    median ESS/s, median wall time; for nrpt log Z (mean over systems per seed; mean, spread
    over seeds), barrier, chains."""
    if not runs:
        return {}
    out = {"seeds": len(runs),
           "max_abs_z": max(_num(r["max_abs_z"]) for r in runs),
           "sd_ratio_min": min(_num(r["sd_ratio_min"]) for r in runs),
           "sd_ratio_max": max(_num(r["sd_ratio_max"]) for r in runs),
           "pass": all(bool(r["pass"]) for r in runs),
           "passes": sum(bool(r["pass"]) for r in runs),
           "ess_per_s": float(np.median([_num(r["ess_per_s"]) for r in runs])),
           "ess_min": min(_num(r.get("ess_bulk_min")) for r in runs),
           "wall_s": float(np.median([_num(r["wall_s"]) for r in runs]))}
    if "log_z" in runs[0]:
        per_seed = [float(np.nanmean([_num(v) for v in r["log_z"]])) for r in runs]
        every = [_num(v) for r in runs for v in r["log_z"]]
        out["log_z"] = float(np.mean(per_seed))
        out["log_z_sd_seeds"] = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else math.nan
        out["log_z_sd_systems"] = float(np.std(every, ddof=1)) if len(every) > 1 else math.nan
        out["barrier"] = float(np.nanmean([_num(v) for r in runs for v in r["barrier"]]))
        chains = [r.get("chains") for r in runs]
        out["chains"] = chains[0] if all(c == chains[0] for c in chains) else chains
        out["rounds"] = [r.get("rounds") for r in runs]
        out["warnings"] = sorted({w for r in runs for w in r.get("warnings", [])})
    return out


def _f(x, fmt="{:.2f}") -> str:
    x = _num(x)
    return "–" if math.isnan(x) else ("inf" if math.isinf(x) else fmt.format(x))


def _range(lo, hi) -> str:
    """``lo–hi`` of sd ratios; "–" where neither is a number (NUTS without draws)."""
    if math.isnan(_num(lo)) and math.isnan(_num(hi)):
        return "–"
    return f"{_f(lo, '{:.3f}')}–{_f(hi, '{:.3f}')}"


def table(results: dict) -> str:
    """The markdown table of every posterior in ``results``."""
    head = ("| posterior | d | nrpt | max \\|z\\| | sd ratio | log Z (sd seeds) | Λ | chains | "
            "wall s | ESS/s | NUTS | max \\|z\\| | sd ratio | wall s | ESS/s |\n"
            "| --- | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | "
            "--- | ---: | ---: |")
    rows = [head]
    for name, rec in results.get("posteriors", {}).items():
        a, b = summarize(rec.get("nrpt", [])), summarize(rec.get("nuts", []))
        if not a:
            err = str(rec.get("error", "not run")).replace("|", "/").replace("\n", " ")[:120]
            rows.append(f"| {name} | {rec.get('dim', '')} | error: {err} |" + " |" * 12)
            continue
        def verdict(s):
            if not s:
                return "–"
            if not s["pass"]:
                return f"**fail** ({s['passes']}/{s['seeds']})"
            # a pass on a handful of effective draws says little: flag it
            return "pass" if not s["ess_min"] < MIN_ESS else f"pass (ESS {s['ess_min']:.0f})"

        rows.append(
            f"| {name} | {rec.get('dim', '')} | {verdict(a)} | {_f(a['max_abs_z'])} | "
            f"{_range(a['sd_ratio_min'], a['sd_ratio_max'])} | "
            f"{_f(a['log_z'])} ({_f(a['log_z_sd_seeds'])}) | {_f(a['barrier'])} | "
            f"{a['chains']} | {_f(a['wall_s'], '{:.0f}')} | {_f(a['ess_per_s'])} | "
            f"{verdict(b)} | {_f(b.get('max_abs_z'))} | "
            f"{_range(b.get('sd_ratio_min'), b.get('sd_ratio_max'))} | "
            f"{_f(b.get('wall_s'), '{:.0f}')} | {_f(b.get('ess_per_s'))} |")
    return "\n".join(rows)


def _multimodal(name: str, rec: dict) -> bool:
    return name in MULTIMODAL or "multimodal" in (rec.get("keywords") or [])


def goals(results: dict) -> list[str]:
    """Issue 25's goals, measured over the posteriors in ``results``: nrpt passes what NUTS
    passes (the exceptions named, and whether nrpt warned on each), median ESS/s ratio, the
    multimodal posteriors, log Z agreement (where ``--log-z-check`` ran)."""
    posts = results.get("posteriors", {})
    both = {n: (summarize(r["nrpt"]), summarize(r["nuts"]))
            for n, r in posts.items() if r.get("nrpt") and r.get("nuts")}
    lines = []
    if both:
        nuts_pass = {n: ab for n, ab in both.items() if ab[1]["pass"]}
        missed = [n for n, (a, _) in nuts_pass.items() if not a["pass"]]
        lines.append(f"- nrpt passes {len(nuts_pass) - len(missed)} of the {len(nuts_pass)} "
                     f"posteriors NUTS passes ({len(both)} run with both)"
                     + (f"; not: {', '.join(missed)}." if missed else "."))
        extra = [n for n, (a, b) in both.items() if a["pass"] and not b["pass"]]
        if extra:
            lines.append(f"- nrpt passes where NUTS does not: {', '.join(extra)}.")
        # (NUTS with no draws in its time cap: ratio inf, kept so the median is not biased)
        ratio = {n: a["ess_per_s"] / b["ess_per_s"] if b["ess_per_s"] > 0 else math.inf
                 for n, (a, b) in both.items() if b["ess_per_s"] > 0 or a["ess_per_s"] > 0}
        if ratio:
            v = list(ratio.values())
            lines.append(f"- ESS/s of nrpt's slot 0 over NUTS's: median {np.median(v):.3f} "
                         f"(range {min(v):.3f}–{max(v):.3f}; nrpt ahead on {sum(x > 1 for x in v)}"
                         f" of {len(v)}; the goal is >= 0.5).")
        multi = [(n, a, b) for n, (a, b) in both.items() if _multimodal(n, posts[n])]
        if multi:
            parts = [f"{n}: nrpt {'pass' if a['pass'] else 'fail'} {a['ess_per_s']:.2f} vs NUTS "
                     f"{'pass' if b['pass'] else 'fail'} {b['ess_per_s']:.2f} ESS/s"
                     for n, a, b in multi]
            # ahead counts only where nrpt passes (a faster wrong answer is not ahead)
            ahead = sum(a["pass"] and a["ess_per_s"] > b["ess_per_s"] for _, a, b in multi)
            lines.append(f"- multimodal (nrpt passes and is ahead of NUTS on {ahead} of "
                         f"{len(multi)}): "
                         + "; ".join(parts) + ".")
    fails = {n: summarize(r["nrpt"]) for n, r in posts.items() if r.get("nrpt")}
    fails = {n: a for n, a in fails.items() if not a["pass"]}
    if fails:
        silent = [n for n, a in fails.items() if not a.get("warnings")]
        lines.append(f"- nrpt's failures: {len(fails)}; "
                     + (f"**without a warning**: {', '.join(silent)}." if silent
                        else "every one warned (below)."))
    errors = [n for n, r in posts.items() if r.get("error")]
    if errors:
        lines.append(f"- errors (no result): {', '.join(errors)}.")
    checked = {n: log_z_agreement(r) for n, r in posts.items()}
    checked = {n: a for n, a in checked.items() if a and "agree" in a}
    if checked:
        bad = [n for n, a in checked.items() if not a["agree"]]
        lines.append(f"- log Z agrees between the two references and between seeds within "
                     f"{MAX_ABS_Z:g} reported errors on {len(checked) - len(bad)} of "
                     f"{len(checked)} posteriors checked" + (f"; not on: {', '.join(bad)}."
                                                             if bad else "."))
    return lines


def write_markdown(results: dict, path: Path) -> None:
    meta = results.get("meta", {})
    lines = ["# posteriordb: nrpt with default settings against Stan's NUTS", "",
             "Written by `benchmarks/posteriordb.py` (`make bench-posteriordb`); the raw numbers "
             f"are in `{path.with_suffix('.json').name}`.  Per posterior, per seed: nrpt "
             "(`nrpt.sample(nrpt.targets.from_stan(program, data), rounds=N, systems=S, "
             "seed=s)` plus the overrides below; N calibrated to the budget) and Stan's NUTS "
             "through the same compiled model (S chains, warm-up + draws calibrated to nrpt's "
             "wall time).  Each compared with posteriordb's reference draws: z of the means "
             "(MCSE from the method's own bulk ESS over its chains, plus the reference's), sd "
             f"ratios; pass = max |z| <= {MAX_ABS_Z:g} and every sd ratio in "
             f"[{SD_RATIO[0]}, {SD_RATIO[1]}] on every seed (\"pass (ESS n)\": a pass whose "
             f"smallest bulk ESS over parameters and seeds is n < {MIN_ESS}, weak evidence).  "
             "ESS/s = min bulk ESS over the "
             "parameters / the run's wall time (compilation and pilots excluded).  log Z: "
             "nrpt's estimate (mean over systems) and its sd over seeds; Λ the estimated "
             "barrier.", "",
             f"- command: `{meta.get('command', '')}`",
             f"- machine: {meta.get('machine', '')}; torch threads {meta.get('threads', '')}; "
             f"date {meta.get('date', '')}; load average at the start "
             f"{_f(meta.get('loadavg_start'))}",
             f"- nrpt options: `{json.dumps(meta.get('nrpt_options', {}))}`, systems "
             f"{meta.get('systems', '')}, seeds {meta.get('seeds', '')}, budget "
             f"{meta.get('budget_s', '')} s per method per seed", "",
             table(results), ""]
    kinds = sorted({str(r.get("log_z_kind")) for rec in results.get("posteriors", {}).values()
                    for r in rec.get("nrpt", [])})
    if "ratio" in kinds:
        lines += ["log Z of a `ratio` kind (a temperature path: nrpt estimates only "
                  "log(Z(tau=1) / Z(tau_max)), not log Z itself) is comparable between seeds "
                  "and settings with the same ladder end, not with other methods; its spread "
                  f"over seeds is the point.  Kinds in this table: {', '.join(kinds)}.", ""]
    lz = log_z_table(results)
    if lz:
        lines += ["## log Z: two normalised references and two seeds", "",
                  "Both references are normalised Gaussians, so both runs estimate log Z of "
                  "Stan's density (constants kept, with the Jacobian) on the unconstrained "
                  "space: the default run (`reference=\"gaussian\"`, refitted between rounds) "
                  "and `--log-z-check`'s (`reference=\"" + LOG_Z_CHECK_REFERENCE + "\"`, the "
                  "broad initial Gaussian kept).  Per seed: nrpt's pooled estimate ± its "
                  "error (`log_normalizer_pooled` ± `_se`: the mean over systems, and the "
                  "larger of the batch-means error sqrt(sum se_i^2) / systems and the "
                  "systems' spread's sd / sqrt(systems)).  z of a difference = difference / "
                  "the two errors in quadrature; agree = every "
                  f"|z| <= {MAX_ABS_Z:g}.  \"systems sd / batch-means se\": the spread of the "
                  "systems' estimates over their batch-means errors (about 1 when those are "
                  "honest; largest over references and seeds; the largest of four honest "
                  "ratios is 0.86-1.90 in 90 % of cases, median 1.31, simulated).  The next "
                  "to last column repeats the check with the batch-means errors alone (this "
                  "table's error before the pooled one); the last names nrpt's own log Z "
                  "warnings in either reference's runs (overlap: a pair of neighbours overlaps "
                  "too little for the bridge, which then reads low in every system alike -- "
                  "agreement within an error does not clear that; halves: the stepping-stone "
                  "halves disagree; systems: the systems disagree beyond their batch-means "
                  "errors).", ""]
        check_meta = meta.get("log_z_check")
        if check_meta:
            lines += [f"- command: `{check_meta.get('command', '')}`; date "
                      f"{check_meta.get('date', '')}; load average at the start "
                      f"{_f(check_meta.get('loadavg_start'))}", ""]
        lines += [lz, ""]
    g = goals(results)
    if g:
        lines += ["## Goals (issue 25) over these posteriors", "", *g, ""]
    warn = []
    for name, rec in results.get("posteriors", {}).items():
        a = summarize(rec.get("nrpt", []))
        if a and not a["pass"]:
            for w in warning_kinds(a.get("warnings", []))[:WARNINGS_SHOWN]:
                warn.append(f"- {name}: {w[:300]}")
    if warn:
        lines += [f"## nrpt's warnings on its failures (one per kind, causes first, at most "
                  f"{WARNINGS_SHOWN} per posterior)", "", *warn, ""]
    notes = meta.get("notes")
    if notes:
        lines += ["## Notes", "", notes, ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


#: warnings shown per failing posterior in the table's warnings section
WARNINGS_SHOWN = 5
#: the order warnings are shown in: causes (step size, chains, ladder) before symptoms
_WARNING_ORDER = ("turn: step_size", "Too few chains", "Swap acceptance", "no restart",
                  "R-hat", "ESS", "log Z")


def warning_kinds(warnings_: list[str]) -> list[str]:
    """One warning per kind (its text up to the first number, and for step-size warnings
    their direction: "... is 0 at 9 slots ... too large" and "... is 0.99 at 2 slots ... too
    small" are two kinds), causes first (:data:`_WARNING_ORDER`)."""
    seen, out = set(), []
    for w in warnings_:
        key = re.split(r"\s[-+]?\d", w, maxsplit=1)[0]
        key = ("small" if "too small" in w else "large" if "too large" in w else "") + key
        if key not in seen:
            seen.add(key)
            out.append(w)

    def rank(w):
        return next((i for i, k in enumerate(_WARNING_ORDER) if k in w), len(_WARNING_ORDER))

    return sorted(out, key=rank)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def _options(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--nrpt-options: not JSON ({err}); "
                         f"e.g. '{{\"explorer\": \"mala\"}}'") from None
    if not isinstance(value, dict):
        raise SystemExit(f"--nrpt-options: a JSON object of nrpt.sample settings, got {text!r}")
    for bad in ("seed", "systems", "progress"):
        if bad in value:
            raise SystemExit(f"--nrpt-options: {bad!r} is set by the benchmark "
                             f"(use --seeds / --systems); remove it")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=str(DEFAULT_DB),
                   help="a posteriordb checkout (default ../shared/posteriordb from the repo)")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="posterior names (or model / data names, e.g. garch11)")
    p.add_argument("--quick", action="store_true",
                   help=f"the quick subset: {', '.join(QUICK)}")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--systems", type=int, default=4,
                   help="nrpt systems = NUTS chains (the chains ESS and R-hat are taken over)")
    p.add_argument("--budget-s", type=float, default=60.0,
                   help="wall seconds per method, posterior and seed (nrpt's rounds are "
                        "calibrated to it; NUTS gets nrpt's measured wall time)")
    p.add_argument("--nrpt-options", type=_options, default={},
                   help="JSON object of nrpt.sample settings over the defaults, e.g. "
                        "'{\"explorer\": \"mala\", \"rounds\": 10}'")
    p.add_argument("--no-nuts", action="store_true", help="skip Stan's NUTS")
    p.add_argument("--keep-nuts", action="store_true",
                   help="re-run nrpt on the chosen posteriors (as --force) but keep the NUTS "
                        "runs stored in the JSON (e.g. after nrpt's defaults changed); a "
                        "posterior without stored NUTS runs it unless --no-nuts")
    p.add_argument("--nuts-from", metavar="JSON",
                   help="take the NUTS runs from this results JSON (another --out's) instead "
                        "of running NUTS for the posteriors it holds")
    p.add_argument("--log-z-check", nargs="?", const=LOG_Z_CHECK_REFERENCE, default=None,
                   metavar="REFERENCE",
                   help="also run nrpt with a second normalised reference (default "
                        f"{LOG_Z_CHECK_REFERENCE!r}) and tabulate log Z agreement between "
                        "references and seeds; on a posterior already in the JSON only the "
                        "check runs")
    p.add_argument("--log-z-check-options", type=_options, default={}, metavar="JSON",
                   help="nrpt settings for the --log-z-check runs only, e.g. '{\"chains\": "
                        "32, \"rounds\": 11}': the fixed broad reference's barrier asks for "
                        "about 2Λ̂ chains (up to ~31 on the cheap posteriors), more than the "
                        "default ladder, and a longer ladder needs its rounds")
    p.add_argument("--out", default=str(DEFAULT_OUT),
                   help="the markdown table (the JSON goes next to it, .json)")
    p.add_argument("--force", action="store_true",
                   help="re-run posteriors already in the JSON")
    p.add_argument("--list", action="store_true", help="list the posteriors and exit")
    p.add_argument("--notes", default=None, help="a paragraph for the table's Notes section")
    p.add_argument("--render", action="store_true",
                   help="only rewrite the table from the JSON (with --notes: set its notes)")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    names = list_posteriors(args.db)
    if args.list:
        for n in names:
            post = load_posterior(args.db, n)
            print(f"{n:50s} d={post.dim}")
        return {}
    if args.quick and not args.only:
        args.only = list(QUICK)
    chosen = select(names, args.only)
    out = Path(args.out)
    json_path = out.with_suffix(".json")
    results = load_results(json_path)
    if args.render:
        if args.notes is not None:
            results.setdefault("meta", {})["notes"] = args.notes
            save_results(results, json_path)
        write_markdown(results, out)
        print(table(results))
        return results
    import torch

    meta = {
        "command": "python benchmarks/posteriordb.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "machine": _machine(), "threads": torch.get_num_threads(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nrpt_options": args.nrpt_options, "systems": args.systems, "seeds": args.seeds,
        "budget_s": args.budget_s, "db": str(database_root(args.db)),
        "loadavg_start": os.getloadavg()[0]}
    check_only = (args.log_z_check and not (args.force or args.keep_nuts)
                  and all(n in results["posteriors"] for n in chosen))
    if check_only:  # the table's run stays described as it was; the check's own line beside
        results.setdefault("meta", {})["log_z_check"] = meta
    else:
        results["meta"] = {**meta, "notes": args.notes or results.get("meta", {}).get("notes"),
                           **({"log_z_check": results["meta"]["log_z_check"]}
                              if "log_z_check" in results.get("meta", {}) else {})}
    kept: dict = {}
    if args.nuts_from:
        src = Path(args.nuts_from)
        if not src.is_file():
            raise SystemExit(f"--nuts-from: {src} is not a file (a results JSON of an --out)")
        kept = load_results(src).get("posteriors", {})
    if args.keep_nuts:
        kept = {**kept, **{n: r for n, r in results["posteriors"].items()}}
    kept = {n: {"nuts": r["nuts"], "settings": r.get("settings", {}),
                "from": args.nuts_from if args.nuts_from and not args.keep_nuts else
                str(json_path)}
            for n, r in kept.items() if r.get("nuts")}
    force = args.force or args.keep_nuts
    def log_z_check(post):  # the second reference's runs (--log-z-check), per seed
        return run_log_z_check(post, seeds=args.seeds, systems=args.systems,
                               budget_s=args.budget_s, options=args.nrpt_options,
                               reference=args.log_z_check,
                               check_options=args.log_z_check_options,
                               target_factory=make_target)

    for name in chosen:
        stored = results["posteriors"].get(name)
        if stored and stored.get("error"):  # an error is no result: run it again
            stored = None
        if stored and not force:
            if args.log_z_check and not stored.get("log_z_check") and stored.get("nrpt"):
                post = load_posterior(args.db, name)
                try:
                    stored["log_z_check"] = log_z_check(post)
                except KeyboardInterrupt:
                    print("  interrupted; the posteriors done so far are saved")
                    break
                save_results(results, json_path)
                write_markdown(results, out)
            else:
                print(f"  {name}: in {json_path.name} already (--force re-runs it)")
            continue
        post = load_posterior(args.db, name)
        t0 = time.perf_counter()
        try:
            rec = run_posterior(post, seeds=args.seeds, systems=args.systems,
                                budget_s=args.budget_s, options=args.nrpt_options,
                                nuts=not args.no_nuts and name not in kept,
                                target_factory=make_target)
            if name in kept:
                rec["nuts"] = kept[name]["nuts"]
                rec["nuts_kept"] = {"from": kept[name]["from"],
                                    "settings": kept[name]["settings"]}
                old_seeds = sorted(r.get("seed") for r in rec["nuts"])
                if old_seeds != sorted(args.seeds):
                    print(f"  {name}: the kept NUTS runs have seeds {old_seeds}, nrpt's "
                          f"{sorted(args.seeds)}")
            if args.log_z_check:
                rec["log_z_check"] = log_z_check(post)
        except KeyboardInterrupt:
            print("  interrupted; the posteriors done so far are saved")
            break
        except Exception as err:  # one posterior's failure must not lose the others
            print(f"  {name}: {type(err).__name__}: {err}")
            rec = {"name": name, "error": f"{type(err).__name__}: {err}", "nrpt": [], "nuts": []}
        rec["total_s"] = time.perf_counter() - t0
        rec["settings"] = {"seeds": args.seeds, "systems": args.systems,
                           "budget_s": args.budget_s, "nrpt_options": args.nrpt_options,
                           "date": results["meta"]["date"], "loadavg_end": os.getloadavg()[0]}
        results["posteriors"][name] = rec
        save_results(results, json_path)
        write_markdown(results, out)
    save_results(results, json_path)
    write_markdown(results, out)
    print(table(results))
    for line in goals(results):
        print(line)
    return results


if __name__ == "__main__":
    main()
