"""The headline run against its NumPy yardstick (``make bench-headline``).

nrpt's headline run (``nrpt run`` with no arguments, :data:`nrpt.run.sgpt.HEADLINE`: DEO*-SGD x P16
on the 25-mode target with a noisy oracle, 20,000 iterations) is timed beside
``benchmarks/headline_numpy.py``, a plain NumPy implementation of the same algorithm, in one
session, round-robin (the order rotates every repeat), ``--reps`` repeats of:

(a) ``numpy``        the yardstick in this process (:func:`headline_numpy.simulate`, the loop and
                     the statistics it computes from its records afterwards);
(b) ``nrpt loop``    nrpt in this process: ``build(RunConfig.from_dict({}, defaults=HEADLINE))``
                     then ``execute(run)``; its ``wall_time_s`` (the loop only; the build is
                     timed apart); the default configuration, so eager chunks of 8 iterations
                     (``fuse = "auto"``) since issue 10's third session, the plain loop before;
(c) ``nrpt run``     the whole process ``nrpt run --out TMP --no-progress --overwrite`` (start to
                     exit: imports, build, loop, checkpoints, summary, posterior.nc; the
                     figures too before stop 39, when a run drew them by default);
(d) ``numpy script`` the whole process ``python benchmarks/headline_numpy.py --out TMP`` (imports,
                     run, statistics, its records saved as .npy).

Subprocesses get ``OMP_NUM_THREADS=1`` and the same ``nrpt`` as this process.  Peak memory: the
peak RSS of each subprocess (``ru_maxrss`` from ``os.wait4`` in a small fork/exec launcher, see
:data:`LAUNCHER`) and, for the in-process runs, the RSS high-water mark of the run minus the
resident set before it, each in a fresh process (``/proc/self/status``; the mark is reset
through ``/proc/self/clear_refs`` first).

The in-process runs use seed = repeat index for both implementations, so their statistics (final
``C`` and learning rates, swap-indicator rates, slot-0 mean / sd, restarts and round trips) are
compared side by side as mean +- sd over the repeats, with a two-sample z score.

Usage: ``python benchmarks/headline.py [--reps 5] [--iterations 20000] [--quick]
[--json benchmarks/headline.json]``; ``--quick`` is 2,000 iterations and writes no JSON unless
``--json`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import headline_numpy as hn  # noqa: E402

#: the authors' research notebook on this machine: about 22 s per 1000 iterations (quoted)
NOTEBOOK_S_PER_1000 = 22.0
KINDS = ("numpy", "nrpt_loop", "nrpt_run", "numpy_script", "nrpt_compiled", "nrpt_fused",
         "nrpt_fused16")
LABELS = {"numpy": "(a) NumPy yardstick, in-process",
          "nrpt_loop": "(b) nrpt loop, default (eager chunks), in-process (wall_time_s)",
          "nrpt_run": "(c) nrpt run, whole process",
          "numpy_script": "(d) NumPy script, whole process",
          "nrpt_compiled": "(e) nrpt loop, compile = true, in-process",
          "nrpt_fused": "(f) nrpt loop, fuse + compile, chunks of 8",
          "nrpt_fused16": "(g) nrpt loop, fuse + compile, chunks of 16"}
#: chunk length of the fused kinds
UNROLL = {"nrpt_fused": 8, "nrpt_fused16": 16}


# ------------------------------------------------------------------------------ the pieces
def headline_config(iterations: int, seed: int, compiled: bool = False,
                    fused: bool | int = False):
    """The run ``nrpt run`` makes with no arguments (other than ``iterations`` / ``seed``;
    ``compiled``: with ``compile = true``; ``fused``: and ``fuse = true``, or ``fuse`` = that
    chunk length when an integer)."""
    from nrpt.run.config import RunConfig
    from nrpt.run.sgpt import HEADLINE

    data = {"compile": True} if compiled or fused else {}
    if fused:
        data["fuse"] = True if fused is True else int(fused)
    if iterations != HEADLINE["iterations"]:
        data["iterations"] = iterations
    if seed != 0:
        data["seed"] = seed
    return RunConfig.from_dict(data, defaults=HEADLINE)


def nrpt_stats(run) -> dict:
    """The statistics of a finished in-process run, from its recorders."""
    rec = run.recorders
    trace = rec["trace"].arrays()
    rt = rec["round_trips"].counts()
    samples = np.asarray(rec["draws"].samples).reshape(-1, 2)
    try:  # the engine's tables after the last update
        C = float(run.engine.params["C"].reshape(-1)[0])
        lr = run.engine.step_size.reshape(-1).tolist()
    except (AttributeError, KeyError):  # else the adaptation trace's last row
        C, lr = float(trace["C"][-1, 0]), np.asarray(trace["learning_rates"][-1, 0]).tolist()
    return {"C": C, "learning_rates": lr,
            "indicator_rate": np.asarray(rec["trace"].indicator_rate()[0]).tolist(),
            "restarts": int(rt["restarts"].sum()), "round_trips": int(rt["round_trips"].sum()),
            "slot0_mean": samples.mean(0).tolist(), "slot0_sd": samples.std(0, ddof=1).tolist()}


def run_nrpt_loop(iterations: int, seed: int, compiled: bool = False, unroll: int = 0,
                  configured: bool = False) -> dict:
    """The loop's ``wall_time_s`` and its steady cost per iteration (from the callback every
    256 iterations, past the first 256: compilation included in the former only); ``unroll``:
    the fused loop (nrpt.core.fused) with chunks of that many iterations, compiled;
    ``configured``: that chunk length given in the config (``fuse = unroll``) rather than set
    on the built run, so the run is built wholly from its config and may load nrpt's saved
    chunk (nrpt.core.precompile) -- ``"precompiled"`` in the result says what it did."""
    from nrpt.core.fused import Fused
    from nrpt.core.loop import execute
    from nrpt.run.build import build

    t0 = time.perf_counter()
    run = build(headline_config(iterations, seed, compiled,
                                fused=(unroll if configured else True) if unroll else False))
    if unroll and not configured and unroll != run.fused.unroll:
        run.fused = Fused(run, unroll=unroll, compile=True)
    t1 = time.perf_counter()
    ticks: list = []
    outcome = execute(run, callback=lambda eng: ticks.append((eng.k, time.perf_counter())))
    steady = None
    if len(ticks) >= 3:  # (the last callback is the segment end's, after its bookkeeping)
        (k0, a), (k1, b) = ticks[0], ticks[-2]
        steady = (b - a) / (k1 - k0) if k1 > k0 else None
    return {"time_s": outcome.wall_time_s, "build_s": t1 - t0, "stats": nrpt_stats(run),
            "steady_s_per_it": steady,
            "precompiled": getattr(getattr(run, "fused", None), "precompiled", None)}


def run_numpy(iterations: int, seed: int) -> dict:
    t0 = time.perf_counter()
    res = hn.simulate(iterations, seed)
    wall = time.perf_counter() - t0
    return {"time_s": wall, "loop_s": res["loop_s"], "stats_s": res["stats_s"],
            "stats": {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                      for k, v in hn.summary(res).items()}}


def child_env() -> dict:
    """This process's environment with one thread and this process's ``nrpt`` first."""
    import nrpt

    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(nrpt.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def nrpt_command() -> list[str]:
    """``python -m nrpt``: the program as the tree on ``PYTHONPATH`` defines it (its
    ``__main__``, :func:`nrpt.run.cli.entry` since stop 38).  Not the console script beside the
    interpreter: in a development environment it was written by an older install and may call
    another function than the tree's own (``main`` before stop 38), or one a compared tree
    lacks."""
    return [sys.executable, "-m", "nrpt"]


#: a minimal launcher: fork, exec the command, report its wall time and rusage.  The command's
#: peak RSS (``ru_maxrss``) must come from a small parent: Linux carries the RSS high-water mark
#: of the address space a process replaces at exec into its ``ru_maxrss``, so a child forked
#: straight from this process (torch loaded) would report at least this process's RSS.
LAUNCHER = """import json, os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t
with open(sys.argv[1], "w") as fh:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "maxrss_kb": ru.ru_maxrss,
               "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime}, fh)
"""


def launch(cmd: list[str], env: dict, tmp: Path) -> dict:
    """What :data:`LAUNCHER` (``python -I -S``, a few MB) reports of ``cmd``: ``rc``,
    ``maxrss_kb``, ``wall_s`` (from the fork to the exit), ``cpu_s`` (user + system of the
    child), and ``stderr`` (its tail)."""
    report = tmp / "launcher.json"
    res = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(report), *cmd],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    got = json.loads(report.read_text())
    report.unlink()
    return {**got, "stderr": res.stderr.decode()[-2000:]}


def timed_child(cmd: list[str], env: dict, tmp: Path) -> tuple[float, float, int, str]:
    """``(wall s from the fork to the exit, peak RSS MB, exit status, stderr tail)`` of
    ``cmd`` (:func:`launch`)."""
    got = launch(cmd, env, tmp)
    return got["wall_s"], got["maxrss_kb"] / 1024.0, got["rc"], got["stderr"]


def run_nrpt_process(iterations: int, tmp: Path, env: dict) -> dict:
    out = tmp / "nrpt-run"
    cmd = [*nrpt_command(), "run", "--out", str(out), "--no-progress", "--overwrite"]
    if iterations != hn.HEADLINE["iterations"]:
        cmd += ["--iterations", str(iterations)]
    wall, rss, code, err = timed_child(cmd, env, tmp)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {code}: {err}")
    summary = json.loads((out / "summary.json").read_text())
    return {"time_s": wall, "peak_rss_mb": rss, "loop_s": summary.get("wall_time_s"),
            "command": " ".join(cmd),
            "stats": {"C": summary.get("correction"), "restarts": summary.get("restarts"),
                      "round_trips": summary.get("round_trips")}}


def run_numpy_process(iterations: int, seed: int, tmp: Path, env: dict) -> dict:
    out = tmp / "numpy-run"
    cmd = [sys.executable, str(HERE / "headline_numpy.py"), "--iterations", str(iterations),
           "--seed", str(seed), "--out", str(out)]
    wall, rss, code, err = timed_child(cmd, env, tmp)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {code}: {err}")
    return {"time_s": wall, "peak_rss_mb": rss, "command": " ".join(cmd)}


# ------------------------------------------------------------------ memory of in-process runs
def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def memory_child(kind: str, iterations: int) -> None:
    """In a fresh process: the peak resident memory an in-process run adds (printed as JSON)."""
    if kind == "nrpt":
        import torch

        torch.set_num_threads(1)
        run_nrpt_loop(50, 1)  # imports and first calls, so that they are not counted
    else:
        hn.simulate(50, 1)
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the high-water mark to the current RSS
    except OSError:
        reset = False
    before = _status()
    (run_nrpt_loop if kind == "nrpt" else run_numpy)(iterations, 0)
    after = _status()
    print(json.dumps({"rss_before_mb": before["VmRSS"], "hwm_after_mb": after["VmHWM"],
                      "peak_delta_mb": after["VmHWM"] - before["VmRSS"], "hwm_reset": reset}))


def inprocess_memory(iterations: int, env: dict) -> dict:
    out = {}
    for kind in ("numpy", "nrpt"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", kind,
               "--iterations", str(iterations)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        out[kind] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------------------ reporting
def machine() -> dict:
    import torch

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    commit = None
    try:
        import nrpt

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(nrpt.__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "nrpt_commit": commit,
            "loadavg_start": list(os.getloadavg())}


def _ms(values) -> tuple[float, float]:
    vals = [float(v) for v in values]
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else math.nan)


def _z(a, b) -> float:
    """Two-sample t statistic with the pooled sd (under the null both are draws of one law)."""
    na, nb = len(a), len(b)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    ss = sum((v - ma) ** 2 for v in a) + sum((v - mb) ** 2 for v in b)
    if na + nb <= 2:
        return math.nan
    se = math.sqrt(ss / (na + nb - 2) * (1.0 / na + 1.0 / nb))
    return (ma - mb) / se if se > 0 else (0.0 if ma == mb else math.inf)


def compare(nrpt_runs: list[dict], numpy_runs: list[dict], K: int) -> tuple[list[str], list]:
    """Side-by-side statistics (mean +- sd over the repeats) and their z scores."""
    rows: list[tuple[str, list[float], list[float]]] = []

    def add(name, get):
        rows.append((name, [get(s) for s in nrpt_runs], [get(s) for s in numpy_runs]))

    add("final C", lambda s: s["C"])
    P = len(nrpt_runs[0]["learning_rates"])
    for p in range(1, P - 1):
        add(f"final learning rate, slot {p}", lambda s, p=p: s["learning_rates"][p])
    add("indicator rate, mean over pairs", lambda s: float(np.mean(s["indicator_rate"])))
    for p in range(P - 1):
        add(f"indicator rate, pair ({p},{p + 1})", lambda s, p=p: s["indicator_rate"][p])
    for i in range(2):
        add(f"slot-0 mean x{i + 1}", lambda s, i=i: s["slot0_mean"][i])
    for i in range(2):
        add(f"slot-0 sd x{i + 1}", lambda s, i=i: s["slot0_sd"][i])
    add("restarts per 1000 it", lambda s: s["restarts"] * 1000.0 / K)
    add("round trips per 1000 it", lambda s: s["round_trips"] * 1000.0 / K)
    lines = [f"{'statistic':<34} {'nrpt (mean +- sd)':>20} {'numpy (mean +- sd)':>20} "
             f"{'t':>6}"]
    table = []
    for name, a, b in rows:
        (ma, sa), (mb, sb), z = _ms(a), _ms(b), _z(a, b)
        flag = "  <-- |t| > 3" if abs(z) > 3 else ""
        lines.append(f"{name:<34} {ma:>10.4g} +- {sa:<7.2g} {mb:>10.4g} +- {sb:<7.2g} "
                     f"{z:>6.2f}{flag}")
        table.append({"statistic": name, "nrpt": a, "numpy": b, "z": z})
    n_big = sum(abs(r["z"]) > 3 for r in table)
    lines.append(f"{n_big} of {len(table)} statistics differ by |t| > 3 (pooled two-sample t; "
                 f"nrpt {len(nrpt_runs)} seeds, numpy {len(numpy_runs)} seeds)")
    return lines, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repeats of each measurement (>= 1)")
    p.add_argument("--iterations", type=int, default=None, help="default 20000 (2000 quick)")
    p.add_argument("--quick", action="store_true", help="2000 iterations, no JSON by default")
    p.add_argument("--json", default=None, help="where to write the results (default "
                                                "benchmarks/headline.json, none with --quick)")
    p.add_argument("--stat-seeds", type=int, default=20,
                   help="extra NumPy-yardstick seeds (untimed) for the statistics comparison")
    p.add_argument("--memory-child", choices=("nrpt", "numpy"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    K = args.iterations or (2000 if args.quick else hn.HEADLINE["iterations"])
    if args.memory_child:
        memory_child(args.memory_child, K)
        return 0
    if args.reps < 1:
        p.error("--reps must be >= 1")
    json_path = args.json or (None if args.quick else str(HERE / "headline.json"))

    import torch

    torch.set_num_threads(1)
    info = machine()
    env = child_env()
    print(f"headline benchmark: {K} iterations, {args.reps} repeats, round-robin; "
          f"{info['cpu']} ({info['cpu_count']} cores), OMP_NUM_THREADS="
          f"{info['omp_num_threads']}, torch {info['torch']} ({info['torch_threads']} thread), "
          f"numpy {info['numpy']}; load average {info['loadavg_start'][0]:.2f}", flush=True)
    run_numpy(200, 99)  # warm-up: first calls of both, imports of nrpt's modules
    run_nrpt_loop(200, 99)

    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="nrpt-headline-") as tmpdir:
        tmp = Path(tmpdir)
        for rep in range(args.reps):
            order = KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]
            for kind in order:
                if kind == "numpy":
                    r = run_numpy(K, rep)
                elif kind == "nrpt_loop":
                    r = run_nrpt_loop(K, rep)
                elif kind == "nrpt_compiled":
                    r = run_nrpt_loop(K, rep, compiled=True)
                elif kind in UNROLL:
                    r = run_nrpt_loop(K, rep, unroll=UNROLL[kind])
                elif kind == "nrpt_run":
                    r = run_nrpt_process(K, tmp, env)
                else:
                    r = run_numpy_process(K, rep, tmp, env)
                results[kind].append(r)
                print(f"  rep {rep + 1}/{args.reps}  {LABELS[kind]:<42} {r['time_s']:8.3f} s",
                      flush=True)
            shutil.rmtree(tmp / "nrpt-run", ignore_errors=True)
        memory = inprocess_memory(K, env)
    info["loadavg_end"] = list(os.getloadavg())

    med = {k: statistics.median(r["time_s"] for r in results[k]) for k in KINDS}
    peak = {"numpy": memory["numpy"]["peak_delta_mb"], "nrpt_loop": memory["nrpt"]["peak_delta_mb"],
            "nrpt_compiled": memory["nrpt"]["peak_delta_mb"],
            "nrpt_fused": memory["nrpt"]["peak_delta_mb"],
            "nrpt_fused16": memory["nrpt"]["peak_delta_mb"],
            "nrpt_run": max(r["peak_rss_mb"] for r in results["nrpt_run"]),
            "numpy_script": max(r["peak_rss_mb"] for r in results["numpy_script"])}
    notebook_s = NOTEBOOK_S_PER_1000 * K / 1000.0
    load = f"load average {info['loadavg_start'][0]:.2f} at the start, " \
           f"{info['loadavg_end'][0]:.2f} at the end"
    lines = ["", f"## timings: {K} iterations, median of {args.reps} repeats ({load})",
             f"{'measurement':<44} {'median s':>9} {'min s':>8} {'max s':>8} {'it/s':>9} "
             f"{'peak MB':>8}"]
    for k in KINDS:
        ts = [r["time_s"] for r in results[k]]
        lines.append(f"{LABELS[k]:<44} {med[k]:9.3f} {min(ts):8.3f} {max(ts):8.3f} "
                     f"{K / med[k]:9.0f} {peak[k]:8.1f}")
    build = statistics.median(r["build_s"] for r in results["nrpt_loop"])
    np_loop = statistics.median(r["loop_s"] for r in results["numpy"])
    cli_loop = statistics.median(r["loop_s"] for r in results["nrpt_run"])
    ratio_loop = med["nrpt_loop"] / med["numpy"]
    ratio_proc = med["nrpt_run"] / med["numpy_script"]
    ratio_comp = med["nrpt_compiled"] / med["numpy"]
    steady = {k: statistics.median(r["steady_s_per_it"] for r in results[k])
              for k in ("nrpt_loop", "nrpt_compiled", *UNROLL)}
    ratio_fused = {k: med[k] / med["numpy"] for k in UNROLL}
    np_per_it = np_loop / K
    lines += [
        f"steady cost per iteration (past the first 256): nrpt {steady['nrpt_loop'] * 1e6:.0f} us,"
        f" nrpt compiled {steady['nrpt_compiled'] * 1e6:.0f} us, NumPy yardstick "
        f"{np_per_it * 1e6:.0f} us (its loop alone)",
        f"ratio nrpt compiled loop / NumPy yardstick:   {ratio_comp:6.2f}x (compilation included;"
        f" steady: {steady['nrpt_compiled'] / np_per_it:.2f}x)",
        *(f"ratio nrpt fused loop ({UNROLL[k]}) / NumPy yardstick: {ratio_fused[k]:6.2f}x "
          f"(compilation included; steady: {steady[k] * 1e6:.0f} us, "
          f"{steady[k] / np_per_it:.2f}x)" for k in UNROLL),
        f"nrpt build (not in the loop time): {build:.3f} s; nrpt run's own loop time "
        f"(summary.json wall_time_s): {cli_loop:.3f} s; yardstick loop alone: {np_loop:.3f} s",
        f"ratio nrpt loop / NumPy yardstick:            {ratio_loop:6.2f}x",
        f"ratio nrpt run / NumPy script (whole process): {ratio_proc:6.2f}x",
        f"vs the authors' notebook (22 s / 1000 it, quoted, not measured here): "
        f"{notebook_s:.0f} s for {K} it -> nrpt loop {notebook_s / med['nrpt_loop']:.0f}x, "
        f"nrpt run (whole process) {notebook_s / med['nrpt_run']:.0f}x, NumPy yardstick "
        f"{notebook_s / med['numpy']:.0f}x faster",
        "peak MB: (c), (d): the process's peak RSS (ru_maxrss, from a small fork/exec "
        "launcher); (a), (b): RSS high-water mark of the run minus the RSS before it, in a "
        "fresh process",
    ]
    extra = [run_numpy(K, 1000 + i)["stats"] for i in range(args.stat_seeds)]  # untimed
    stat_lines, stat_table = compare([r["stats"] for r in results["nrpt_loop"]],
                                     [r["stats"] for r in results["numpy"]] + extra, K)
    cli, mine = results["nrpt_run"][0]["stats"], results["nrpt_loop"][0]["stats"]
    same = (cli["restarts"] == mine["restarts"] and cli["round_trips"] == mine["round_trips"]
            and cli["C"] is not None and abs(cli["C"] - mine["C"]) <= 1e-9 * max(1, abs(cli["C"])))
    stat_lines.append(f"in-process nrpt, seed 0 = the `nrpt run` subprocess (same C, restarts, "
                      f"round trips): {'yes' if same else 'NO'} (C {mine['C']:.6g} vs "
                      f"{cli['C']})")
    lines += ["", f"## same statistics? in-process runs, seeds 0..{args.reps - 1} each",
              *stat_lines]
    fused_lines, fused_table = compare([r["stats"] for r in results["nrpt_fused"]],
                                       [r["stats"] for r in results["numpy"]] + extra, K)
    lines += ["", "## the fused loop (chunks of 8, compiled) against the same NumPy runs",
              *fused_lines]
    print("\n".join(lines), flush=True)

    if json_path:
        doc = {"iterations": K, "reps": args.reps, "machine": info,
               "median_s": med, "iterations_per_s": {k: K / med[k] for k in KINDS},
               "peak_mb": peak, "memory_inprocess": memory, "nrpt_build_s": build,
               "numpy_loop_s": np_loop, "nrpt_run_loop_s": cli_loop,
               "ratio_nrpt_loop_over_numpy": ratio_loop,
               "ratio_nrpt_run_over_numpy_script": ratio_proc,
               "ratio_nrpt_compiled_loop_over_numpy": ratio_comp,
               "ratio_nrpt_fused_loop_over_numpy": ratio_fused,
               "statistics_fused": fused_table,
               "steady_s_per_iteration": {**steady, "numpy": np_per_it},
               "notebook_s_quoted": notebook_s,
               "speedup_vs_notebook": {k: notebook_s / med[k] for k in KINDS},
               "commands": {"nrpt_run": results["nrpt_run"][0]["command"],
                            "numpy_script": results["numpy_script"][0]["command"]},
               "raw": {k: [{kk: vv for kk, vv in r.items() if kk not in ("stats", "command")}
                           for r in results[k]] for k in KINDS},
               "statistics": stat_table, "inprocess_equals_nrpt_run": same}
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
