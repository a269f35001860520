"""Peer benchmark (issue 10): nrpt beside TFP's ReplicaExchangeMC, ptemcee and reddemcee on
the same work, "mix25" (see ``protocol.py`` and docs/benchmarks.md).

Run:  make bench-peers            (= OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peers/bench.py)
      python benchmarks/peers/bench.py --quick        (a smoke run: 100 iterations, 1 rep)
      python benchmarks/peers/bench.py --tools nrpt-fixed tfp-even-odd --reps 3

The peers live in a throwaway virtual environment (``benchmarks/peers/.venv``, or
``$NRPT_PEERS_VENV``), created on first use from the pinned ``requirements-*.txt`` (one pip call
per peer, so a peer that cannot be installed is reported as such and the others still run).
Every run of every tool is a fresh subprocess (nrpt's in this interpreter's venv, the peers' in
the peer venv) with one thread (OMP / MKL / OPENBLAS_NUM_THREADS = 1, XLA_FLAGS for XLA's CPU
backend) that prints one JSON line; its whole-process time and CPU time are measured here.
Tools run round-robin (one run of each tool per repetition, the order rotated between
repetitions); medians over repetitions are reported.  Output: one aligned table and
``benchmarks/peers/results.json`` (every run, the medians, the machine, the versions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import protocol  # noqa: E402

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}

#: tool -> (runner, extra arguments, peer requirement group or None for nrpt, description)
TOOLS = {
    "nrpt-fixed": ("run_nrpt.py", ["--variant", "fixed"], None,
                   "nrpt, the protocol's ladder, RWMH, DEO"),
    "nrpt-adaptive": ("run_nrpt.py", ["--variant", "adaptive"], None,
                      "nrpt, adaptive rounds (schedule + RWMH scales), DEO"),
    "nrpt-compiled": ("run_nrpt.py", ["--variant", "compiled"], None,
                      "nrpt, the protocol's ladder, RWMH step compiled (compile = true), DEO"),
    "nrpt-fused": ("run_nrpt.py", ["--variant", "fused"], None,
                   "nrpt, the protocol's ladder, RWMH, DEO, chunks of 8 iterations as one "
                   "compiled graph (fuse = true, compile = true)"),
    "nrpt-fused-eager": ("run_nrpt.py", ["--variant", "fused-eager"], None,
                         "nrpt, the protocol's ladder, RWMH, DEO, chunks of 8 iterations run "
                         "eagerly (fuse = true)"),
    "tfp-even-odd": ("run_tfp.py", ["--swap", "even-odd"], "tfp",
                     "TFP ReplicaExchangeMC, RWMH, even_odd_swap_proposal_fn(1.)"),
    "tfp-default": ("run_tfp.py", ["--swap", "default"], "tfp",
                    "TFP ReplicaExchangeMC, RWMH, default_swap_proposal_fn(1.)"),
    "ptemcee": ("run_ptemcee.py", [], "ptemcee",
                "ptemcee, stretch move (its only move), 32 walkers x 8 temperatures"),
    "reddemcee": ("run_reddemcee.py", [], "reddemcee",
                  "reddemcee, RWMH move, 32 walkers x 8 temperatures, fixed ladder"),
}
PROBES = {"tfp": "import jax, tensorflow_probability.substrates.jax as t; t.mcmc.ReplicaExchangeMC",
          "ptemcee": "import numpy as np; np.float = float; import ptemcee",
          "reddemcee": "import reddemcee"}
ENSEMBLE = ("ptemcee", "reddemcee")


# ------------------------------------------------------------------------------ peer venv
def peer_venv() -> Path:
    return Path(os.environ.get("NRPT_PEERS_VENV", HERE / ".venv"))


def peer_python(vdir: Path) -> Path:
    return vdir / "bin" / "python"


def install_peers(groups: list[str], say=print) -> dict[str, str | None]:
    """Create / reuse the peer venv and install each needed group; group -> None (usable) or
    the reason it is not."""
    vdir = peer_venv()
    py = peer_python(vdir)
    status: dict[str, str | None] = {}
    if not py.exists():
        say(f"creating the peer venv {vdir}")
        try:
            venv.EnvBuilder(with_pip=True, clear=False).create(vdir)
        except Exception as err:  # no venv module / no ensurepip
            return {g: f"cannot create the peer venv: {type(err).__name__}: {err}"
                    for g in groups}
    for g in groups:
        req = HERE / f"requirements-{g}.txt"
        digest = hashlib.sha256(req.read_bytes()).hexdigest()[:16]
        stamp = vdir / f".installed-{g}"
        if not (stamp.exists() and stamp.read_text().strip() == digest):
            say(f"installing {g} into the peer venv ({req.name})")
            r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-"
                                "check", "-r", str(req)], capture_output=True, text=True)
            if r.returncode != 0:
                status[g] = "pip install failed: " + _tail(r.stderr or r.stdout)
                continue
            stamp.write_text(digest + "\n")
        r = subprocess.run([str(py), "-c", PROBES[g]], capture_output=True, text=True,
                           env=_env(peer=True))
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        status[g] = None if r.returncode == 0 else "import failed: " + last[-300:]
    return status


def peer_freeze() -> list[str]:
    py = peer_python(peer_venv())
    if not py.exists():
        return []
    r = subprocess.run([str(py), "-m", "pip", "freeze", "--disable-pip-version-check"],
                       capture_output=True, text=True)
    return r.stdout.split()


def _tail(text: str, n: int = 300) -> str:
    lines = [ln for ln in text.strip().splitlines() if "is ignored" not in ln]
    return " | ".join(lines)[-n:]


def _env(peer: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(ONE_THREAD)
    if not peer:
        env["PYTHONPATH"] = str(ROOT / "src")
    return env


# ------------------------------------------------------------------------------ bytecode
def byte_compile(peer: Path | None = None) -> None:
    """Compile nrpt's sources and the runners' modules (this folder) to bytecode
    (``__pycache__``, git-ignored) before the timed runs, as an installed package is: the
    peers' and torch's bytecode was written when pip installed them, while nrpt here runs from
    its source tree, where an environment with ``PYTHONDONTWRITEBYTECODE`` (or a read-only
    checkout) makes every process compile its ~70 modules again (~0.12 s CPU, measured in
    docs/benchmarks.md), a cost of the checkout, not of nrpt.  ``peer``: the peer venv's
    Python, which compiles this folder for itself too (its bytecode tag may differ)."""
    cmds = [[sys.executable, "-m", "compileall", "-q", str(ROOT / "src" / "nrpt")],
            [sys.executable, "-m", "compileall", "-q", "-l", str(HERE)]]
    if peer is not None:
        cmds.append([str(peer), "-m", "compileall", "-q", "-l", str(HERE)])
    for cmd in cmds:
        subprocess.run(cmd, capture_output=True, text=True, check=True)


# ------------------------------------------------------------------------------ one run
def run_one(tool: str, args, seed: int) -> dict:
    script, extra, group, _ = TOOLS[tool]
    py = sys.executable if group is None else str(peer_python(peer_venv()))
    size = ["--walkers" if tool in ENSEMBLE else "--systems", str(args.systems)]
    cmd = [py, str(HERE / script), "--iterations", str(args.iterations), "--seed", str(seed),
           *size, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        pin = None if args.pin_cpu is None else (lambda: os.sched_setaffinity(0, {args.pin_cpu}))
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(group is not None),
                           timeout=args.timeout, preexec_fn=pin)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -1, e.stdout or "", f"timed out after {args.timeout} s"
        out = out.decode() if isinstance(out, bytes) else out
    process_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res = None
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
                break
            except json.JSONDecodeError:
                pass
    if rc != 0 or res is None:
        res = {"tool": tool, "ok": False,
               "error": f"exit {rc}: " + _tail(err if isinstance(err, str) else str(err), 600)}
    res.update(name=tool, seed=seed, process_s=process_s, process_cpu_s=cpu)
    return res


# ------------------------------------------------------------------------------ report
FIELDS = ("wall_s", "loop_s", "steady_s", "startup_s", "process_s", "process_cpu_s",
          "cpu_per_wall", "process_cpu_per_wall",
          "modes_visited", "max_freq_error",
          "round_trips_per_iter", "swap_acceptance", "log_z", "log_z_error")


def derived(r: dict) -> dict:
    r = dict(r)
    if r.get("ok"):
        r["startup_s"] = (r.get("compile_s") or 0.0) + (r.get("warmup_s") or 0.0)
        r["cpu_per_wall"] = r["timed_cpu_s"] / r["wall_s"] if r.get("timed_cpu_s") else None
        r["process_cpu_per_wall"] = (r["process_cpu_s"] / r["process_s"] if r["process_s"]
                                     else None)
    return r


def medians(runs: list[dict]) -> dict:
    ok = [derived(r) for r in runs if r.get("ok")]
    out = {"reps_ok": len(ok), "reps": len(runs)}
    for f in FIELDS:
        vals = [r[f] for r in ok if r.get(f) is not None]
        out[f] = statistics.median(vals) if vals else None
    walls = [r["wall_s"] for r in ok]
    out["wall_s_min"] = min(walls) if walls else None
    out["wall_s_max"] = max(walls) if walls else None
    if not ok and runs:
        out["error"] = runs[-1].get("error")
    return out


def _f(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def table(summary: dict, unavailable: dict, tools: list[str]) -> str:
    head = ["tool", "wall s", "(min-max)", "loop s", "steady s", "warm-up s", "process s",
            "cpu/wall", "modes",
            "max|f-1/25|", "RT/it/sys", "swap acc", "log Z", "|err|"]
    rows = []
    for t in tools:
        if t in unavailable:
            rows.append([t, f"unavailable: {unavailable[t]}"])
            continue
        m = summary[t]
        if not m["reps_ok"]:
            rows.append([t, f"failed: {m.get('error', '?')}"])
            continue
        rows.append([t, _f(m["wall_s"], ".2f"),
                     f"{_f(m['wall_s_min'], '.2f')}-{_f(m['wall_s_max'], '.2f')}",
                     _f(m.get("loop_s"), ".2f"), _f(m.get("steady_s"), ".2f"),
                     _f(m["startup_s"], ".2f"), _f(m["process_s"], ".2f"),
                     _f(m["cpu_per_wall"], ".2f"), _f(m["modes_visited"], ".0f"),
                     _f(m["max_freq_error"], ".4f"), _f(m["round_trips_per_iter"], ".4f"),
                     _f(m["swap_acceptance"], ".3f"), _f(m["log_z"], ".3f"),
                     _f(m["log_z_error"], ".3f")])
    full = [r for r in rows if len(r) == len(head)]
    widths = [max(len(str(r[i])) for r in [head] + full) for i in range(len(head))]
    lines = ["  ".join(str(h).rjust(w) if i else str(h).ljust(w)
                       for i, (h, w) in enumerate(zip(head, widths, strict=True)))]
    lines.append("-" * len(lines[0]))
    for r in rows:
        if len(r) == len(head):
            lines.append("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        else:
            lines.append(f"{r[0].ljust(widths[0])}  {r[1]}")
    return "\n".join(lines)


NRPT = ("nrpt-fixed", "nrpt-adaptive", "nrpt-compiled", "nrpt-fused", "nrpt-fused-eager")


def ratios(runs: list[dict], summary: dict, field: str = "wall_s",
           base_field: str = "wall_s") -> dict:
    """nrpt ``field`` / TFP even-odd ``base_field``: of the medians, and the median of the
    per-repetition ratios (runs of one repetition are back to back).  ``field``: ``wall_s``
    (the whole ``nrpt.sample`` call: build, loop, summary), ``steady_s`` (the loop's cost past
    its first 256 iterations, scaled to the run), both against TFP's timed run (after its
    compilation); or ``process_s`` (``process_cpu_s``) against TFP's (whole processes, wall (CPU
    time of the process and its children): interpreter,
    imports, warm-up or compilation, the timed run)."""
    out = {}
    base = summary.get("tfp-even-odd", {}).get(base_field)
    for v in NRPT:
        m = summary.get(v, {}).get(field)
        per = []
        for rep in {r["rep"] for r in runs}:
            a = [r.get(field) for r in runs
                 if r["rep"] == rep and r["name"] == v and r.get("ok") and r.get(field)]
            b = [r[base_field] for r in runs
                 if r["rep"] == rep and r["name"] == "tfp-even-odd" and r.get("ok")]
            if a and b:
                per.append(a[0] / b[0])
        out[v] = {"ratio_of_medians": m / base if m and base else None,
                  "median_per_rep_ratio": statistics.median(per) if per else None,
                  "per_rep": per}
    return out


def machine() -> dict:
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    return {"cpu_model": model, "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=protocol.ITERATIONS)
    ap.add_argument("--systems", type=int, default=protocol.SYSTEMS,
                    help="PT systems (walkers per temperature for ptemcee / reddemcee)")
    ap.add_argument("--tools", nargs="+", choices=tuple(TOOLS), default=list(TOOLS))
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 100 iterations, 1 repetition (numbers not for reporting)")
    ap.add_argument("--seed", type=int, default=1, help="seed of repetition 0 (then +1 ...)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--pin-cpu", type=int, default=None, metavar="N",
                    help="run every tool's process on CPU N only (sched_setaffinity); default: "
                         "not pinned, one thread by the environment variables")
    ap.add_argument("--no-byte-compile", dest="byte_compile", action="store_false",
                    help="leave nrpt's sources and the runners uncompiled (each process then "
                         "compiles them where bytecode cannot be written: the measurements "
                         "before issue 24's lane start)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.iterations, args.reps = min(args.iterations, 100), 1

    tools = list(dict.fromkeys(args.tools))
    groups = sorted({TOOLS[t][2] for t in tools} - {None})
    status = install_peers(groups) if groups else {}
    unavailable = {t: status[TOOLS[t][2]] for t in tools
                   if TOOLS[t][2] is not None and status.get(TOOLS[t][2])}
    active = [t for t in tools if t not in unavailable]
    if args.byte_compile:
        byte_compile(peer_python(peer_venv()) if groups and any(
            TOOLS[t][2] is not None for t in active) else None)
    print(f"mix25: {protocol.CHAINS} temperatures, beta 1 -> {protocol.BETA_MIN}, "
          f"{args.systems} systems, {args.iterations} iterations, {args.reps} repetitions, "
          f"round-robin over {', '.join(active)}", flush=True)

    runs = []
    for rep in range(args.reps):
        order = active[rep % len(active):] + active[:rep % len(active)] if active else []
        for t in order:
            r = run_one(t, args, args.seed + rep)
            r["rep"] = rep
            runs.append(r)
            state = (f"wall {r['wall_s']:.2f} s, process {r['process_s']:.2f} s"
                     if r.get("ok") else r.get("error"))
            print(f"  rep {rep} {t:14s} {state}", flush=True)

    summary = {t: medians([r for r in runs if r["name"] == t]) for t in active}
    rat = ratios(runs, summary)
    rat_steady = ratios(runs, summary, "steady_s")
    rat_process = ratios(runs, summary, "process_s", "process_s")
    rat_process_cpu = ratios(runs, summary, "process_cpu_s", "process_cpu_s")
    print()
    print(table(summary, unavailable, tools))
    print()
    for label, rr, base in (("whole nrpt.sample call", rat, "timed run"),
                            ("steady loop", rat_steady, "timed run"),
                            ("whole process", rat_process, "whole process"),
                            ("whole process CPU", rat_process_cpu, "whole process CPU")):
        for v, r in rr.items():
            if v in active and "tfp-even-odd" in active:
                print(f"{v} {label} / tfp-even-odd {base}: "
                      f"{_f(r['ratio_of_medians'], '.2f')} (ratio of medians), "
                      f"{_f(r['median_per_rep_ratio'], '.2f')} (median of per-repetition "
                      f"ratios)")
    print("round trips per iteration per system (slot 0 -> hottest -> slot 0; ensembles: total "
          f"/ {args.systems}): " + ", ".join(
              f"{t} {_f(summary[t]['round_trips_per_iter'], '.4f')}" for t in active))

    ratio_exact = protocol.LOG_Z - protocol.log_z_at(protocol.BETA_MIN)
    for r in runs:
        if r.get("log_z") is not None:
            r["log_z_error_vs_ratio"] = abs(r["log_z"] - ratio_exact)
    versions: dict[str, dict] = {}
    for r in runs:
        if r.get("versions"):
            versions.setdefault(r["name"], r["versions"])
    result = {
        "benchmark": "peers/mix25", "command": "make bench-peers",
        "protocol": {"target": "uniform prior on [-6, 6]^2 x normalized mixture of 25 "
                               "Gaussians (sigma 0.2) on {-4, -2, 0, 2, 4}^2",
                     "log_z_exact": protocol.LOG_Z,
                     "log_z_ratio_exact": ratio_exact,
                     "log_z_ratio_note": "log(Z_1 / Z_beta_min), what a ladder ending at "
                                         "beta_min estimates (midpoint rule)",
                     "chains": protocol.CHAINS,
                     "betas": protocol.betas(), "rwmh_scales": protocol.scales(),
                     "systems": args.systems, "iterations": args.iterations,
                     "reps": args.reps, "quick": args.quick, "pin_cpu": args.pin_cpu,
                     "byte_compiled": args.byte_compile},
        "machine": machine(), "versions": versions, "peer_venv": str(peer_venv()),
        "peer_venv_freeze": peer_freeze() if groups else [],
        "unavailable": unavailable, "threads": ONE_THREAD,
        "summary": summary, "ratios_vs_tfp_even_odd": rat,
        "steady_ratios_vs_tfp_even_odd": rat_steady,
        "process_ratios_vs_tfp_even_odd": rat_process,
        "process_cpu_ratios_vs_tfp_even_odd": rat_process_cpu, "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
