"""Golden outputs of a fixed list of configurations, to check a refactor changes no number.

    python benchmarks/golden.py record OUT_DIR [--only NAME,...] [--perturb NAME]
    python benchmarks/golden.py compare DIR_A DIR_B
    python benchmarks/golden.py list

``record`` runs every configuration (:data:`CONFIGS`: each scheme x each exact explorer,
adaptive rounds, variational references, the DEO*-SGD headline, the other stochastic-gradient
explorers, minibatch / control-variate (VR) / reflected runs, fused and unfused twins, a tiny
deep fit per method, CLI runs with 1 and 2 processes) at a fixed seed and writes per
configuration ``NAME.npz`` (samples, energies, index process, adaptation trace, report rows'
arrays, deep: collected models and the BMA probabilities on the test set) and ``NAME.json``
(the summary and per-segment rows without anything volatile: timings, rates per second,
thread counts, paths, pids, versions, dates, hosts).  ``compare`` checks two such folders bit
for bit (``np.array_equal`` with the dtype and shape, exact JSON equality) and exits 1 on any
difference.  ``--perturb NAME`` shifts one configuration's seed (a negative control).

Only the public, stable surface is used -- ``nrpt.sample``, ``Result``'s attributes,
``nrpt.deep.fit`` and the CLI (``python -m nrpt run ...``) -- so that the same script records
the same configurations before and after code moves between modules.  Run it with one thread
(``OMP_NUM_THREADS=1``); ``threads=1`` is passed to every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

import nrpt

# --------------------------------------------------------------------------- volatile keys
#: summary / row keys dropped before comparing: timings, throughput, threads, identities of
#: the machine, process, version and folder
VOLATILE = re.compile(
    r"(time|wall|second|elapsed|duration|clock|cpu|(^|_)s$|per_s$|_us$|_ms$|throughput|"
    r"thread|pid|host|version|date|created|started|finished|^out$|_dir$|^dir$|folder|"
    r"run_id|^inference_data$|^figures$|python|platform|torch|numpy)", re.IGNORECASE)


#: volatile key names met while recording (written to ``_dropped_keys.txt`` for review)
DROPPED: set[str] = set()


def _keep(key) -> bool:
    if VOLATILE.search(str(key)):
        DROPPED.add(str(key))
        return False
    return True


def clean(obj, tmp: str | None = None):
    """``obj`` without volatile keys (recursively); floats kept exactly (repr round-trips),
    NaN / inf as strings; the temporary root in strings replaced by ``<TMP>``."""
    if isinstance(obj, dict):
        return {str(k): clean(v, tmp) for k, v in obj.items() if _keep(k)}
    if isinstance(obj, (list, tuple)):
        return [clean(v, tmp) for v in obj]
    if isinstance(obj, np.ndarray):
        return clean(obj.tolist(), tmp)
    if isinstance(obj, torch.Tensor):
        return clean(obj.detach().cpu().tolist(), tmp)
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else repr(f)
    if isinstance(obj, str):
        return obj.replace(tmp, "<TMP>") if tmp else obj
    if obj is None:
        return None
    return repr(obj)


# --------------------------------------------------------------------------- a data target
class MixtureMean:
    """A minibatch data target (duck-typed, no nrpt import): VR-reSGLD's mixture-mean model,
    ``d_i ~ 0.5 N(mu, 25) + 0.5 N(20 - mu, 25)``, N = 200 data from a fixed seed, flat prior."""

    name = "golden-mixture-mean"
    dim = 1

    def __init__(self, n_data: int = 200, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        comp = torch.rand(n_data, generator=g, dtype=torch.float64) < 0.5
        centre = torch.where(comp, torch.tensor(-5.0, dtype=torch.float64),
                             torch.tensor(25.0, dtype=torch.float64))
        self.data = centre + 5.0 * torch.randn(n_data, generator=g, dtype=torch.float64)
        self.n_data = n_data

    def loss(self, x, batch):
        batch = batch.to(x.dtype)
        mu, s2 = x[:, :1], 25.0
        a = -0.5 * (batch - mu) ** 2 / s2
        b = -0.5 * (batch - (20.0 - mu)) ** 2 / s2
        return -(torch.logaddexp(a, b) + math.log(0.5) - 0.5 * math.log(2 * math.pi * s2))

    def prior_energy(self, x):
        return x.new_zeros(x.shape[0])

    def energy(self, x):
        batch = self.data.to(x.device).unsqueeze(0).expand(x.shape[0], self.n_data)
        return self.prior_energy(x) + self.loss(x, batch).sum(-1)

    def initial_states(self, n, generator, dtype=torch.float64):
        return -8.0 + 6.0 * torch.rand(int(n), 1, generator=generator, dtype=dtype,
                                       device=generator.device)


# --------------------------------------------------------------------------- configurations
EXACT = ("rwmh", "mala", "hmc", "slice")
SCHEMES = ("adj", "seo", "deo", "ape", "none")
SMALL = dict(target="twenty-five-modes", chains=6, systems=2, iterations=300)
HEADLINE = dict(target="twenty-five-modes", target_options={"penalty": True}, chains=16,
                iterations=400, scheme="deo-w", window="swap-rate", explorer="sgd",
                noise_sd=2.0, lr_min=0.003, lr_max=0.6, swap_rate=0.4, correction=4.0,
                swap_rule="deterministic", adapt=True, bottom_temperature=1.0)
SG = dict(target="twenty-five-modes", chains=6, systems=2, iterations=200, noise_sd=2.0)
MINI = dict(chains=5, systems=2, max_temperature=20.0, batch_size=10, iterations=200,
            explorer="sgld", swap_rule="bias-corrected")
CLI_SMALL = ["--preset", "none", "--target", "twenty-five-modes", "--chains", "4",
             "--iterations", "200", "--figures", "false"]


def _configs() -> dict[str, dict]:
    """name -> {kind: sample | deep | cli, ...}: the fixed list (order = run order)."""
    c: dict[str, dict] = {}
    for scheme in SCHEMES:
        for ex in EXACT:
            c[f"exact-{scheme}-{ex}"] = dict(kind="sample", opts=dict(SMALL, scheme=scheme,
                                                                        explorer=ex))
    for ex in EXACT:  # DEO_W with exact energies is legal with the always-accept rule
        c[f"exact-deo-w-{ex}"] = dict(kind="sample", opts=dict(
            SMALL, scheme="deo-w", window=3, swap_rule="always", explorer=ex))
    c["exact-deo-rwmh-thin-burnin"] = dict(kind="sample", opts=dict(
        SMALL, scheme="deo", explorer="rwmh", thin=3, burn_in=40, systems=1))
    c["exact-deo-hmc-float32"] = dict(kind="sample", opts=dict(
        SMALL, scheme="deo", explorer="hmc", dtype="float32"))
    c["exact-deo-slice-doubling"] = dict(kind="sample", opts=dict(
        SMALL, scheme="deo", explorer="slice", slice_method="doubling"))
    # adaptive rounds
    c["adaptive-slice"] = dict(kind="sample", opts=dict(
        target="geometric-gaussian-path", rounds=6, chains=6, systems=2))
    c["adaptive-mala"] = dict(kind="sample", opts=dict(
        target="geometric-mixture-model", rounds=6, chains=6, explorer="mala"))
    c["adaptive-temperature-rwmh"] = dict(kind="sample", opts=dict(
        target="twenty-five-modes", rounds=6, chains=6, explorer="rwmh", systems=2))
    # variational references
    c["variational-fullrank"] = dict(kind="sample", opts=dict(
        target="geometric-shifted-gaussian-path", rounds=6, chains=6, systems=2,
        reference="variational", explorer="mala"))
    c["variational-meanfield"] = dict(kind="sample", opts=dict(
        target="geometric-mixture-model", rounds=6, chains=6, reference="variational-meanfield",
        explorer="slice"))
    # stochastic gradient: the headline, every SG explorer, rules, VR, reflection
    c["sg-headline-deo-star-sgd"] = dict(kind="sample", opts=dict(HEADLINE))
    c["sg-headline-window1"] = dict(kind="sample", opts=dict(HEADLINE, window=1))
    for ex in ("sgld", "sghmc", "msgd", "psgld", "psgd"):
        c[f"sg-{ex}"] = dict(kind="sample", opts=dict(SG, explorer=ex))
    c["sg-sgld-bias-corrected"] = dict(kind="sample", opts=dict(
        SG, explorer="sgld", swap_rule="bias-corrected", scheme="deo"))
    c["sg-sgd-window-auto"] = dict(kind="sample", opts=dict(
        SG, explorer="sgd", scheme="deo-w", window="auto", window_tune=50))
    c["sg-minibatch"] = dict(kind="sample", target="mixture-mean", opts=dict(MINI))
    c["sg-vr-control-variate"] = dict(kind="sample", target="mixture-mean",
                                      opts=dict(MINI, vr_every=3))
    c["sg-reflected-box"] = dict(kind="sample", opts=dict(SG, explorer="sgld",
                                                          domain="box:-6,6"))
    c["sg-reflected-ball-sghmc"] = dict(kind="sample", opts=dict(SG, explorer="sghmc",
                                                                 domain="ball:8"))
    # fused chunks and the plain loop (each compared with itself over time, not with the other)
    c["fuse-true"] = dict(kind="sample", opts=dict(SMALL, scheme="deo", explorer="rwmh",
                                                   fuse=True))
    c["fuse-false"] = dict(kind="sample", opts=dict(SMALL, scheme="deo", explorer="rwmh",
                                                    fuse=False))
    c["fuse-true-sg-headline"] = dict(kind="sample", opts=dict(HEADLINE, fuse=True))
    c["fuse-false-sg-headline"] = dict(kind="sample", opts=dict(HEADLINE, fuse=False))
    # deep: a tiny MLP on digits, every method
    for method in ("deo-star", "deo", "ensemble", "cyclical", "swag"):
        c[f"deep-{method}"] = dict(kind="deep", method=method)
    # the CLI: the default (headline preset) run, an exact run, and it on 2 processes
    c["cli-default-preset"] = dict(kind="cli", args=["--iterations", "300", "--figures",
                                                     "false"])
    c["cli-exact-1proc"] = dict(kind="cli", args=list(CLI_SMALL))
    c["cli-exact-2proc"] = dict(kind="cli", args=[*CLI_SMALL, "--nproc", "2"])
    c["cli-adaptive-2proc"] = dict(kind="cli", args=[
        "--target", "geometric-gaussian-path", "--rounds", "5", "--chains", "4",
        "--figures", "false", "--nproc", "2"])
    return c


CONFIGS = _configs()


def seed_of(name: str, perturb: set[str]) -> int:
    """A fixed seed per configuration (crc32 of its name), shifted by one under --perturb."""
    return zlib.crc32(name.encode()) % 100_000 + (1 if name in perturb else 0)


# --------------------------------------------------------------------------- runners
def run_sample(name: str, spec: dict, seed: int, tmp: str) -> tuple[dict, dict]:
    opts = dict(spec["opts"], seed=seed)
    target = opts.pop("target", "twenty-five-modes")
    if spec.get("target") == "mixture-mean":
        target = MixtureMean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = nrpt.sample(target, progress=False, threads=1, **opts)
    arrays = {"samples": np.asarray(res.samples), "energies": np.asarray(res.energies),
              "index": np.asarray(res.index)}
    for k, v in (res.trace() or {}).items():
        arrays[f"trace_{k}"] = np.asarray(v)
    meta = {"summary": res.summary, "rows": res.rows}
    return arrays, meta


def _digits():
    """scikit-learn's 8x8 digits, scaled to [0, 1], a fixed split: 300 train, 200 test."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:300], perm[300:500]
    return X[tr], y[tr], X[te], y[te]


def _mlp(seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m


def run_deep(name: str, spec: dict, seed: int, tmp: str) -> tuple[dict, dict]:
    import nrpt.deep

    Xtr, ytr, Xte, yte = _digits()
    # only the settings the method reads (one it does not read is an error)
    own = {"deo-star": dict(swap_rate=0.05), "deo": dict(swap_rate=0.05),
           "swag": dict(swag_rank=3, swag_samples=3)}.get(spec["method"], {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = nrpt.deep.fit(_mlp(seed), train=(Xtr, ytr), test=(Xte, yte),
                            method=spec["method"], chains=3, epochs=4, seed=seed,
                            batch_size=50, lr_min=0.01, lr_max=0.05, pretrain_epochs=1.0,
                            burn_in=0.25, strategy="loop", eval_every=2.0, **own)
    arrays = {"bma_proba": res.predict_proba(Xte).detach().cpu().numpy()}
    if res.index is not None:
        arrays["index"] = np.asarray(res.index)
    if res.models is not None:
        arrays["models"] = res.models.detach().cpu().numpy()
    if res.buffers is not None and res.buffers.numel():
        arrays["buffers"] = res.buffers.detach().cpu().numpy()
    for k, v in (res.trace or {}).items():
        try:
            arrays[f"trace_{k}"] = np.asarray(v)
        except Exception:  # noqa: BLE001 -- a non-array trace entry goes to the JSON
            pass
    meta = {"summary": res.summary, "metrics": res.metrics,
            "trace": {k: v for k, v in (res.trace or {}).items() if f"trace_{k}" not in arrays}}
    return arrays, meta


def run_cli(name: str, spec: dict, seed: int, tmp: str) -> tuple[dict, dict]:
    out = Path(tmp) / name
    cmd = [sys.executable, "-m", "nrpt", "run", *spec["args"], "--seed", str(seed),
           "--out", str(out), "--threads", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    arrays = {}
    for f in ("samples", "energies", "index"):
        if (out / f"{f}.npy").exists():
            arrays[f] = np.load(out / f"{f}.npy")
    if (out / "adaptation.npz").exists():
        with np.load(out / "adaptation.npz") as z:
            arrays.update({f"trace_{k}": z[k] for k in z.files})
    meta = {"summary": json.loads((out / "summary.json").read_text())}
    if (out / "rounds.csv").exists():
        meta["rounds_csv"] = [line.split(",") for line in
                              (out / "rounds.csv").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return arrays, meta


RUNNERS = {"sample": run_sample, "deep": run_deep, "cli": run_cli}


def _clean_csv(meta: dict) -> None:
    """rounds.csv: drop the volatile columns (by header)."""
    rows = meta.get("rounds_csv")
    if not rows:
        return
    keep = [i for i, h in enumerate(rows[0]) if _keep(h)]
    meta["rounds_csv"] = [[r[i] for i in keep if i < len(r)] for r in rows]


def record(out_dir: str, only: list[str] | None, perturb: set[str]) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = only or list(CONFIGS)
    bad = [n for n in names + sorted(perturb) if n not in CONFIGS]
    if bad:
        raise SystemExit(f"unknown configuration(s) {bad}; see `golden.py list`")
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nrpt-golden-") as tmp:
        for name in names:
            spec = CONFIGS[name]
            seed = seed_of(name, perturb)
            t0 = time.perf_counter()
            arrays, meta = RUNNERS[spec["kind"]](name, spec, seed, tmp)
            _clean_csv(meta)
            meta = clean(meta, tmp)
            meta["golden"] = {"name": name, "kind": spec["kind"], "seed": seed,
                              "spec": clean({k: v for k, v in spec.items() if k != "kind"})}
            np.savez(out / f"{name}.npz", **arrays)
            (out / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            print(f"{name:34s} {time.perf_counter() - t0:6.2f} s  "
                  f"{', '.join(f'{k}{list(v.shape)}' for k, v in arrays.items())[:100]}",
                  flush=True)
    (out / "_dropped_keys.txt").write_text("".join(f"{k}\n" for k in sorted(DROPPED)))
    print(f"recorded {len(names)} configurations in {time.perf_counter() - t_all:.1f} s "
          f"into {out}")
    return 0


# --------------------------------------------------------------------------- compare
def _first_json_diff(a, b, path="") -> tuple[str, str] | None:
    """(path, description) of the first difference, or None."""
    if type(a) is not type(b):
        return path or "/", f"type {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}", "only in " + ("B" if k not in a else "A")
            d = _first_json_diff(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return path, f"length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = _first_json_diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if a != b:
        extra = f" (abs diff {abs(a - b):.3g})" if isinstance(a, float) else ""
        return path, f"{a!r:.60} vs {b!r:.60}{extra}"
    return None


def _max_json_diff(a, b) -> float:
    """The largest |a - b| over numbers at the same place (0 when none differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return max([_max_json_diff(a[k], b[k]) for k in set(a) & set(b)], default=0.0)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max([_max_json_diff(x, y) for x, y in zip(a, b, strict=True)], default=0.0)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            not isinstance(a, bool) and not isinstance(b, bool):
        return float(abs(a - b))
    return 0.0


#: the eager chunks' layout in the summary (``summary.fused``: iterations per chunk, chunks run):
#: how the loop grouped its iterations, not a number it drew (eager chunks of any length give
#: the plain loop's numbers bit for bit, tests/test_fused.py), so compared as ``threads`` is:
#: not at all (``compiled`` still is)
LAYOUT = ("chunk", "chunks")


def _without_layout(j):
    fused = j.get("summary", {}).get("fused") if isinstance(j, dict) else None
    if isinstance(fused, dict):
        for k in LAYOUT:
            fused.pop(k, None)
    return j


def compare_one(da: Path, db: Path, name: str) -> tuple[bool, str]:
    for d in (da, db):
        if not (d / f"{name}.npz").exists() or not (d / f"{name}.json").exists():
            return False, f"missing in {d}"
    notes = []
    with np.load(da / f"{name}.npz") as za, np.load(db / f"{name}.npz") as zb:
        keys = sorted(set(za.files) | set(zb.files))
        for k in keys:
            if k not in za.files or k not in zb.files:
                notes.append(f"array {k}: only in {'A' if k in za.files else 'B'}")
                continue
            a, b = za[k], zb[k]
            if a.dtype != b.dtype or a.shape != b.shape:
                notes.append(f"array {k}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
            elif not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                n = int((diff > 0).sum() + (np.isnan(a) != np.isnan(b)).sum()
                        if a.dtype.kind in "fc" else (a != b).sum())
                notes.append(f"array {k}: {n} of {a.size} entries differ, max abs diff "
                             f"{np.nanmax(diff):.3g}")
    ja = _without_layout(json.loads((da / f"{name}.json").read_text()))
    jb = _without_layout(json.loads((db / f"{name}.json").read_text()))
    d = _first_json_diff(ja, jb)
    if d:
        notes.append(f"json {d[0]}: {d[1]}; max abs diff over numbers "
                     f"{_max_json_diff(ja, jb):.3g}")
    return not notes, "; ".join(notes[:3]) + (f" (+{len(notes) - 3} more)" if len(notes) > 3
                                              else "")


def compare(dir_a: str, dir_b: str) -> int:
    da, db = Path(dir_a), Path(dir_b)
    names = sorted({p.stem for d in (da, db) for p in d.glob("*.json")},
                   key=lambda n: (list(CONFIGS).index(n) if n in CONFIGS else 10 ** 6, n))
    if not names:
        print(f"no configurations in {da} or {db}")
        return 1
    fails = 0
    for name in names:
        ok, why = compare_one(da, db, name)
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok else f": {why}"))
    missing = [n for n in CONFIGS if n not in names]
    print(f"{len(names) - fails} PASS, {fails} FAIL of {len(names)} configurations"
          + (f" ({len(missing)} of the list not recorded in either)" if missing else ""))
    return 1 if fails else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the fixed configurations, write NAME.npz/NAME.json")
    r.add_argument("out_dir")
    r.add_argument("--only", default=None, help="comma-separated configuration names")
    r.add_argument("--perturb", default="",
                   help="comma-separated names whose seed is shifted by 1 (negative control)")
    c = sub.add_parser("compare", help="compare two recorded folders bit for bit")
    c.add_argument("dir_a")
    c.add_argument("dir_b")
    sub.add_parser("list", help="the configuration names")
    args = p.parse_args(argv)
    if args.cmd == "record":
        only = [s for s in args.only.split(",") if s] if args.only else None
        perturb = {s for s in (args.perturb or "").split(",") if s}
        return record(args.out_dir, only, perturb)
    if args.cmd == "compare":
        return compare(args.dir_a, args.dir_b)
    for n, spec in CONFIGS.items():
        print(f"{n:34s} {spec['kind']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
