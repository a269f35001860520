"""Cost per iteration of the engine vs the number of chains P and the dimension d (issue 10).

For each explorer (RWMH, MALA, HMC), on an anisotropic diagonal Gaussian with a closed-form
energy and gradient (:class:`DiagonalGaussian`), DEO swaps, the fixed default temperature ladder
(no adaptation) and ``systems = R`` independent copies, three timings are taken in the same
process, back to back and interleaved (full, bare, floor, full, bare, floor, ...):

* **full** — one iteration of a run built by ``nrpt.run.build.build(RunConfig(...))`` and executed
  by
  ``nrpt.core.loop.execute`` (explore, swaps, and the recorders ``nrpt.sample`` uses; no run folder,
  draws kept in memory), from the loop's own clock ``Outcome.wall_time_s``: building the run is
  not timed.  A fresh run is built for every repeat;
* **bare** — the batched explorer step alone, ``engine.explorer.step(state, b, h,
  engine.density, noise)`` with the same shapes ``[R, P, d]`` (a new ``nrpt.explorers.Noise``
  per step, as the engine makes one per iteration);
* **floor** — one batched energy + gradient evaluation of the target on ``[R * P, d]``
  (``target.energy(x)`` and ``target.grad_energy(x)``): the physical floor of one gradient
  step.  RWMH needs only the energy, MALA one energy + gradient per iteration, HMC
  ``leapfrog_steps`` of them (the JSON holds ``evals_per_iteration``).

``full / floor`` falls to its floor (1 for MALA, about L for HMC) once the target's work
dominates the engine's fixed per-iteration overhead; ``full / bare`` is the price of everything
that is not the explorer (swaps, recorders, the loop).

Each timing is repeated ``--reps`` times (default 5) with at least ``--min-time`` seconds
(default 0.2) of iterations per repeat, and the medians are reported.  Before the repeats every
timing is warmed up and calibrated (runs of growing length until one takes 0.8 ``min-time``).
The script pins ``--threads`` torch threads (default 1) and records them, the CPU model and the
load average in the JSON.

Sweeps (defaults): vs P in {4, ..., 256} at d = 2 and R = 1 for every explorer, plus the same
sweep at R = 8 for RWMH (``--extra-systems``); vs d in {2, 10, 100, 1000, 10^4} at P = 16 and
P = 64 (``--dim-P``); and vs d in {1000, 10^4} at P = 16 on :class:`LogisticRegression` with
1000 observations (``--logistic-dims``, ``--logistic-n``: a target whose energy does a model's
work, where ``full / floor`` can reach its floor).  An empty sweep: ``--P 0``, ``--dims 0``,
``--logistic-dims 0``.

Outputs: a printed table, ``benchmarks/scaling.json``, ``docs/figures/scaling_P.png`` and
``docs/figures/scaling_dim.png`` (log-log).

Run:  make bench-scaling     (or: python benchmarks/scaling.py)
      python benchmarks/scaling.py --quick        (a smoke test; numbers not for reporting)
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from nrpt.core.loop import execute
from nrpt.explorers import Noise
from nrpt.run.build import build
from nrpt.run.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
_EXECUTE_THREADS = "threads" in inspect.signature(execute).parameters  # newer nrpt
#: the plain loop where nrpt has the fused one (fuse = "auto" is its default)
_PLAIN = {"fuse": False} if "fuse" in inspect.signature(RunConfig).parameters else {}
EXPLORERS = ("rwmh", "mala", "hmc")
DEFAULTS = {"P": [4, 8, 16, 32, 64, 128, 256], "dims": [2, 10, 100, 1000, 10_000],
            "dim_P": [16, 64], "reps": 5, "min_time": 0.2, "extra_systems": 8,
            "logistic_dims": [1000, 10_000], "logistic_n": 1000}
QUICK = {"P": [4, 16], "dims": [2, 100], "dim_P": [16], "reps": 2, "min_time": 0.02,
         "extra_systems": 0, "logistic_dims": [100], "logistic_n": 50}


# ----------------------------------------------------------------------------- the target
class DiagonalGaussian:
    """``N(0, diag(1 / precision))`` with precisions spread geometrically over ``[1,
    condition]``: ``U(x) = 0.5 sum_i precision_i x_i^2`` and ``grad U(x) = precision * x``, both
    one pass over ``x[n, d]`` (a target whose cost is the memory traffic of its input)."""

    analytic_gradients = True  # closed forms: the loop may run in torch.inference_mode

    def __init__(self, dim: int, condition: float = 10.0):
        self.dim = int(dim)
        self.name = f"diagonal-gaussian-{self.dim}"
        expo = torch.linspace(0.0, 1.0, self.dim, dtype=torch.float64) if self.dim > 1 else \
            torch.zeros(1, dtype=torch.float64)
        self.precision = float(condition) ** expo

    def _prec(self, x: torch.Tensor) -> torch.Tensor:
        return self.precision.to(dtype=x.dtype, device=x.device)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x * x * self._prec(x)).sum(-1)

    def grad_energy(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._prec(x)


class LogisticRegression:
    """Bayesian logistic regression with ``n`` observations in ``d`` dimensions (synthetic data,
    features ``N(0, 1/d)``, labels ``+-1`` drawn from the model at a standard normal weight, a
    standard normal prior): ``U(w) = sum_i log(1 + exp(-y_i x_i.w)) + |w|^2 / 2`` and
    ``grad U(w) = -X^T (y sigmoid(-y X w)) + w``, each one ``[m, d] x [d, n]`` product.  A
    target whose energy does the work of a model with data, unlike :class:`DiagonalGaussian`
    (whose energy and gradient cost about what one elementwise pass over ``x`` costs)."""

    analytic_gradients = True

    def __init__(self, dim: int, n: int = 1000, seed: int = 0):
        self.dim, self.n = int(dim), int(n)
        self.name = f"logistic-regression-{self.dim}x{self.n}"
        g = torch.Generator().manual_seed(seed)
        self.X = torch.randn(self.n, self.dim, generator=g, dtype=torch.float64) / self.dim**0.5
        w = torch.randn(self.dim, generator=g, dtype=torch.float64)
        p = torch.sigmoid(self.X @ w)
        self.y = torch.where(torch.rand(self.n, generator=g, dtype=torch.float64) < p, 1.0, -1.0)
        self.Xt = self.X.T.contiguous()

    def energy(self, w: torch.Tensor) -> torch.Tensor:
        margins = (w @ self.Xt) * self.y
        return torch.nn.functional.softplus(-margins).sum(-1) + 0.5 * (w * w).sum(-1)

    def grad_energy(self, w: torch.Tensor) -> torch.Tensor:
        margins = (w @ self.Xt) * self.y
        return w - (self.y * torch.sigmoid(-margins)) @ self.X


def step_size(explorer: str, d: int) -> float:
    """Slot-0 step size of the usual dimension scaling (the ladder widens hotter slots): the
    acceptance stays reasonable at every d, so the runs do typical work."""
    return {"rwmh": 1.0 * d ** -0.5, "mala": 0.6 * d ** (-1 / 6),
            "hmc": 0.3 * d ** -0.25}[explorer]


def evals_per_iteration(explorer: str, leapfrog: int) -> int:
    return {"rwmh": 1, "mala": 1, "hmc": leapfrog}[explorer]


# ----------------------------------------------------------------------------- timings
class Point:
    """The three timings of one (explorer, P, d, R) point: :meth:`run` (full), :meth:`bare`
    and :meth:`floor` each return the seconds that ``n`` iterations took."""

    def __init__(self, explorer: str, P: int, d: int, R: int, leapfrog: int, seed: int = 0,
                 data: int = 0):
        self.explorer, self.P, self.d, self.R = explorer, int(P), int(d), int(R)
        self.leapfrog, self.seed = int(leapfrog), int(seed)
        self.target = LogisticRegression(d, data) if data else DiagonalGaussian(d)
        self.engine = None
        self.state = None
        self.k = 0
        self.run(1)  # an engine for the bare step to start from

    def config(self, n: int) -> RunConfig:
        extra = {"leapfrog_steps": self.leapfrog} if self.explorer == "hmc" else {}
        return RunConfig(target="gaussian", chains=self.P, systems=self.R, iterations=int(n),
                         explorer=self.explorer, step_size=step_size(self.explorer, self.d),
                         scheme="deo", seed=self.seed, figures=False, **_PLAIN, **extra)

    def run(self, n: int) -> float:
        """``n`` iterations of a freshly built run, by the loop's own clock, with the torch
        thread count in force (the one the bare step and the floor run with; the loop's own
        choice, ``"auto"``, would take one thread for small states whatever ``--threads``)."""
        run = build(self.config(n), target=self.target)
        kw = {"threads": torch.get_num_threads()} if _EXECUTE_THREADS else {}
        out = execute(run, **kw)
        self.loop_threads = out.notes.get("threads", torch.get_num_threads())
        self.engine, self.state, self.k = run.engine, run.engine.state, run.engine.k
        return out.wall_time_s

    def bare(self, n: int) -> float:
        eng = self.engine
        explorer, density, state = eng.explorer, eng.density, self.state
        b = eng.slot_params(eng.schedule)
        h = eng.slot_params(eng.step_size)
        R, P, dev, seed, k0 = eng.R, eng.P, eng.device, eng.seed, self.k
        with torch.inference_mode(eng.autograd_free):  # as the loop runs it
            t0 = time.perf_counter()
            for i in range(n):
                state, _ = explorer.step(state, b, h, density, Noise(seed, k0 + i, R, P, dev))
            t = time.perf_counter() - t0
        self.state, self.k = state, k0 + n
        return t

    def floor(self, n: int) -> float:
        x = self.state.x.reshape(self.R * self.P, self.d).clone()
        energy, grad = self.target.energy, self.target.grad_energy
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(n):
                energy(x)
                grad(x)
            return time.perf_counter() - t0


def calibrate(fn, min_time: float, warmup: int, cap: int = 1 << 22) -> int:
    """Warm ``fn`` up (``warmup`` iterations), then grow ``n`` (at most 16x a try) until
    ``fn(n)`` takes at least 0.8 ``min_time``; returns that ``n``.  (Small runs overstate the
    time per iteration -- a segment's fixed costs -- so ``n`` is checked, not extrapolated.)"""
    fn(max(1, warmup))
    n = 1
    while True:
        t = fn(n)
        if t >= 0.8 * min_time or n >= cap:
            return n
        grow = min(16.0, 1.1 * min_time / max(t, 1e-9))
        n = min(cap, max(n + 1, math.ceil(n * grow)))


def measure(explorer: str, P: int, d: int, R: int, *, reps: int, min_time: float,
            leapfrog: int, warmup: int, data: int = 0) -> dict[str, Any]:
    pt = Point(explorer, P, d, R, leapfrog, data=data)
    kinds = {"full": pt.run, "bare": pt.bare, "floor": pt.floor}
    n = {k: calibrate(fn, min_time, warmup) for k, fn in kinds.items()}
    per_it: dict[str, list[float]] = {k: [] for k in kinds}
    gc.collect()  # once per point (a full collection takes ~0.1 s with torch loaded)
    for _ in range(reps):  # interleaved: full, bare, floor, full, ...
        for k, fn in kinds.items():
            per_it[k].append(fn(n[k]) / n[k] * 1e6)
    med = {k: statistics.median(v) for k, v in per_it.items()}
    return {"explorer": explorer, "P": P, "dim": d, "systems": R, "target": pt.target.name,
            "full_us": med["full"], "bare_us": med["bare"], "floor_us": med["floor"],
            "full_over_bare": med["full"] / med["bare"],
            "full_over_floor": med["full"] / med["floor"],
            "evals_per_iteration": evals_per_iteration(explorer, leapfrog),
            "step_size": step_size(explorer, d), "iterations_per_rep": n,
            "loop_threads": pt.loop_threads,
            "reps_us": per_it}


# ----------------------------------------------------------------------------- output
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


HEAD = f"{'':>6} {'full us':>10} {'bare us':>10} {'floor us':>10} {'full/bare':>9} " \
       f"{'full/floor':>10}"


def row_text(x: int, r: dict) -> str:
    return (f"{x:>6} {r['full_us']:>10.1f} {r['bare_us']:>10.1f} {r['floor_us']:>10.2f} "
            f"{r['full_over_bare']:>9.2f} {r['full_over_floor']:>10.1f}")


def sweep(name: str, axis: str, explorer: str, values, fixed: dict, args) -> list[dict]:
    title = ", ".join(f"{k} = {v}" for k, v in fixed.items())
    on = "logistic regression" if fixed.get("n") else "diagonal Gaussian"
    print(f"\n{explorer} on the {on}: vs {axis} ({title}); us per iteration, medians of "
          f"{args.reps}")
    print(HEAD.replace(f"{'':>6}", f"{axis:>6}", 1), flush=True)
    rows = []
    for v in values:
        kw = {"P": fixed.get("P"), "d": fixed.get("d"), "R": fixed.get("R", 1)}
        kw["P" if axis == "P" else "d"] = v
        r = measure(explorer, kw["P"], kw["d"], kw["R"], reps=args.reps, min_time=args.min_time,
                    leapfrog=args.leapfrog, warmup=args.warmup, data=fixed.get("n", 0))
        r["sweep"] = name
        rows.append(r)
        print(row_text(v, r), flush=True)
    return rows


STYLE = {"full": ("C0", "o", "full iteration (loop.execute)"),
         "bare": ("C1", "s", "bare explorer step"),
         "floor": ("C2", "^", "floor: one energy + gradient on [R·P, d]")}
RATIOS = {"full_over_floor": ("C3", "D", "full / floor"),
          "full_over_bare": ("C4", "v", "full / bare")}


def figure(rows: list[dict], axis: str, group: str, path: Path, meta: dict,
           dpi: int = 110) -> Path:
    """Top row: µs per iteration (full, bare, floor), one panel per explorer, shared y axis;
    bottom row: the ratios full/floor and full/bare.  ``group`` (``systems`` or ``P``) sets the
    line style; one legend for the figure, below the panels."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    explorers = [e for e in EXPLORERS if any(r["explorer"] == e for r in rows)]
    fig = Figure(figsize=(4.4 * len(explorers) + 0.6, 7.8), layout="constrained")
    axes = fig.subplots(2, len(explorers), squeeze=False, sharex="col", sharey="row")
    styles = ["-", "--", ":", "-."]
    xkey = "P" if axis == "P" else "dim"
    xlabel = "number of chains P (slots), d = 2" if axis == "P" else "dimension d"
    groups = sorted({r[group] for r in rows})
    tags = {g: (f"R = {g} system" + ("s" if g > 1 else "")) if group == "systems" else
            f"P = {g}" for g in groups}
    xs_all = sorted({r[xkey] for r in rows})
    for j, e in enumerate(explorers):
        top, bot = axes[0, j], axes[1, j]
        mine = [r for r in rows if r["explorer"] == e]
        for gi, g in enumerate(groups):
            pts = sorted((r for r in mine if r[group] == g), key=lambda r: r[xkey])
            if not pts:
                continue
            xs, ls = [r[xkey] for r in pts], styles[gi % len(styles)]
            for kind, (color, marker, _) in STYLE.items():
                top.plot(xs, [r[f"{kind}_us"] for r in pts], ls, color=color, marker=marker,
                         ms=4)
            for key, (color, marker, _) in RATIOS.items():
                bot.plot(xs, [r[key] for r in pts], ls, color=color, marker=marker, ms=4)
        ev = mine[0]["evals_per_iteration"] if mine else 1
        bot.axhline(1.0, color="0.3", lw=0.8)
        if ev > 1:
            bot.axhline(ev, color="0.5", lw=0.8, ls=":")
            bot.annotate(f"{ev} gradient evaluations / iteration", (0.02, ev),
                         xycoords=("axes fraction", "data"), va="bottom", fontsize=7,
                         color="0.35")
        top.set_title(f"{e.upper()}" + (f" ({meta['leapfrog']} leapfrog steps)"
                                        if e == "hmc" else ""))
        for ax in (top, bot):
            ax.set_xscale("log", base=2 if axis == "P" else 10)
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
        bot.xaxis.set_major_locator(FixedLocator(xs_all))
        bot.xaxis.set_minor_locator(NullLocator())
        fmt = ScalarFormatter()
        fmt.set_scientific(False)
        bot.xaxis.set_major_formatter(fmt)
        bot.set_xlabel(xlabel)
    axes[0, 0].set_ylabel("time per iteration (µs)")
    axes[1, 0].set_ylabel("ratio (full / floor, full / bare)")
    handles = [Line2D([], [], color=c, marker=m, ms=4, label=lab)
               for c, m, lab in (*STYLE.values(), *RATIOS.values())]
    if len(groups) > 1:
        handles += [Line2D([], [], color="0.3", ls=styles[i % len(styles)], label=tags[g])
                    for i, g in enumerate(groups)]
    fixed = f"{tags[groups[0]]}, " if len(groups) == 1 else ""
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4),
               fontsize=8, frameon=False)
    fig.suptitle(f"nrpt cost per iteration vs {xlabel.split(',')[0]} ({fixed}DEO, fixed "
                 f"ladder, float64): diagonal Gaussian, analytic gradient\n"
                 f"{meta['torch_threads']} torch thread(s), {meta['cpu_model']}, load average "
                 f"{meta['loadavg_start']}; medians of {meta['reps']} repeats", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


# ----------------------------------------------------------------------------- main
def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"few points, short timings (smoke test): {QUICK}")
    ap.add_argument("--explorers", nargs="+", choices=EXPLORERS, default=list(EXPLORERS))
    ap.add_argument("--P", type=int, nargs="+", help=f"P sweep at d = 2 ({DEFAULTS['P']}); "
                                                     "an empty sweep: --P 0")
    ap.add_argument("--dims", type=int, nargs="+",
                    help=f"dimension sweep ({DEFAULTS['dims']}); an empty sweep: --dims 0")
    ap.add_argument("--dim-P", type=int, nargs="+", help=f"P of the dimension sweep "
                                                         f"({DEFAULTS['dim_P']})")
    ap.add_argument("--logistic-dims", type=int, nargs="+",
                    help="dimension sweep on the logistic regression, at the first --dim-P "
                         f"({DEFAULTS['logistic_dims']}); an empty sweep: --logistic-dims 0")
    ap.add_argument("--logistic-n", type=int,
                    help=f"observations of the logistic regression ({DEFAULTS['logistic_n']})")
    ap.add_argument("--reps", type=int, help=f"repeats per timing ({DEFAULTS['reps']})")
    ap.add_argument("--min-time", type=float,
                    help=f"seconds of iterations per repeat ({DEFAULTS['min_time']})")
    ap.add_argument("--extra-systems", type=int, help="also the P sweep with this many systems "
                    f"R for RWMH (0: not; default {DEFAULTS['extra_systems']})")
    ap.add_argument("--leapfrog", type=int, default=10, help="HMC leapfrog steps (10)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up iterations per timing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "scaling.json")
    ap.add_argument("--figures-dir", type=Path, default=ROOT / "docs" / "figures")
    ap.add_argument("--no-figures", action="store_true")
    args = ap.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.dims = [d for d in args.dims if d > 0]
    args.P = [p for p in args.P if p > 0]
    args.logistic_dims = [d for d in args.logistic_dims if d > 0]
    if args.reps < 1 or args.min_time <= 0:
        ap.error("--reps must be >= 1 and --min-time > 0")
    if args.logistic_n < 1:
        ap.error("--logistic-n must be >= 1 (an empty logistic sweep: --logistic-dims 0)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # short runs: health notes are noise here
    meta = {"target": "diagonal Gaussian (precisions 1..10), analytic energy and gradient",
            "dtype": "float64", "scheme": "deo", "ladder": "fixed (default temperatures)",
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(),
            "loadavg_start": loadavg(), "leapfrog": args.leapfrog, "reps": args.reps,
            "min_time_s": args.min_time, "warmup": args.warmup, "quick": args.quick,
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None
                                                           else sys.argv[1:])])}
    print(f"nrpt scaling: {meta['target']}; torch {meta['torch']}, "
          f"{meta['torch_threads']} torch thread(s) (OMP_NUM_THREADS="
          f"{meta['omp_num_threads']}), CPU {meta['cpu_model']} x{meta['cpu_count']}, "
          f"load average {meta['loadavg_start']}")
    print("full: loop.execute wall time / iteration; bare: explorer.step alone; floor: one "
          "energy + gradient on [R*P, d]")
    t0 = time.perf_counter()
    rows_P: list[dict] = []
    rows_d: list[dict] = []
    if args.P:
        for e in args.explorers:
            rows_P += sweep("P", "P", e, args.P, {"d": 2, "R": 1}, args)
        if args.extra_systems and args.extra_systems != 1 and "rwmh" in args.explorers:
            rows_P += sweep("P", "P", "rwmh", args.P, {"d": 2, "R": args.extra_systems}, args)
    for Pd in args.dim_P if args.dims else []:
        for e in args.explorers:
            rows_d += sweep("dim", "d", e, args.dims, {"P": Pd, "R": 1}, args)
    rows_data: list[dict] = []
    for e in args.explorers if args.logistic_dims else []:
        rows_data += sweep("dim-logistic", "d", e, args.logistic_dims,
                           {"P": args.dim_P[0], "R": 1, "n": args.logistic_n}, args)
    meta["logistic_n"] = args.logistic_n
    meta["loadavg_end"] = loadavg()
    meta["wall_s"] = time.perf_counter() - t0
    result = {"meta": meta, "rows": rows_P + rows_d + rows_data, "figures": {}}
    if not args.no_figures:
        if rows_P:
            result["figures"]["P"] = str(figure(rows_P, "P", "systems",
                                                args.figures_dir / "scaling_P.png", meta))
        if rows_d:
            result["figures"]["dim"] = str(figure(rows_d, "dim", "P",
                                                  args.figures_dir / "scaling_dim.png", meta))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwall {meta['wall_s']:.0f} s, load average {meta['loadavg_start']} -> "
          f"{meta['loadavg_end']}; wrote {args.json}"
          + "".join(f", {p}" for p in result["figures"].values()))
    return result


if __name__ == "__main__":
    main()
