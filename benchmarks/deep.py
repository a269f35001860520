"""Deep posteriors (docs/reproduction/deep.md): throughput of the execution strategies and the
equal-budget table of the AAAI paper's methods on MNIST-1D and digits, and on the diabetes
regression set (test log-likelihood and RMSE).

    python benchmarks/deep.py throughput [--repeats 7] [--compile]
    python benchmarks/deep.py table --dataset mnist1d --model mlp --seeds 5 --epochs 30 \\
        --chains 4 [--methods deo-star,deo,ensemble,cyclical,swag]
    python benchmarks/deep.py windows --dataset mnist1d --seeds 3 --epochs 30

Run with OMP_NUM_THREADS=1 (the Makefile's bench-deep does).  Every ratio is measured side by
side in one process; medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nrpt import rng  # noqa: E402
from nrpt.core.engine import PTEngine  # noqa: E402
from nrpt.deep.data import load_dataset  # noqa: E402
from nrpt.deep.energy import NetworkEnergy, NetworkTarget  # noqa: E402
from nrpt.deep.fitting import METHODS, fit  # noqa: E402
from nrpt.deep.methods import BUILDERS  # noqa: E402
from nrpt.deep.models import build_model  # noqa: E402
from nrpt.deep.replicas import FunctionalNet  # noqa: E402
from nrpt.explorers.sgmcmc import MomentumSGD  # noqa: E402
from nrpt.paths.ladders import NoiseLadder  # noqa: E402
from nrpt.swap import DEOW, Deterministic, NoSwap  # noqa: E402


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def throughput(args) -> None:
    ds = load_dataset("mnist1d", seed=0)
    cases = [("mlp", ds), ("cnn1d", ds)]
    B = args.batch
    print(f"replicas x examples per second (batch {B} per replica, median of {args.repeats}); "
          f"threads = {torch.get_num_threads()}")
    print(f"{'model':<7} {'P':>3} {'loop':>10} {'vmap':>10} {'compile':>10} "
          f"{'vmap/loop':>9} {'comp/loop':>9} {'compile s':>9}")
    out = []
    for name, d in cases:
        for P in args.chains:
            g = torch.Generator().manual_seed(0)
            model = build_model(name, tuple(d.input_shape), d.classes, generator=g)
            net = FunctionalNet(model)
            theta, buf = net.pack()
            theta = theta.expand(P, -1).clone()
            buf = buf.expand(P, -1).clone()
            idx = torch.randint(d.x_train.shape[0], (P, B), generator=g)
            x, y = d.x_train[idx], d.y_train[idx]
            row = {"model": name, "P": P}
            for s in ("loop", "vmap") + (("compile",) if args.compile else ()):
                if s == "compile":
                    t0 = time.perf_counter()
                    net.loss_and_grad(theta, buf, x, y, s)
                    row["compile_s"] = time.perf_counter() - t0
                call = (net.loss_and_grad, (theta, buf, x, y, s))
                row[s] = _median_time(lambda c=call: c[0](*c[1]), args.repeats)
            rate = {s: P * B / row[s] for s in ("loop", "vmap", "compile") if s in row}
            print(f"{name:<7} {P:>3} {rate['loop']:>10.0f} {rate['vmap']:>10.0f} "
                  f"{rate.get('compile', float('nan')):>10.0f} "
                  f"{row['loop'] / row['vmap']:>9.2f} "
                  f"{row['loop'] / row.get('compile', float('nan')):>9.2f} "
                  f"{row.get('compile_s', float('nan')):>9.1f}")
            out.append(row)
    # swap overhead: one engine step with DEO swaps vs the same without
    print("\nswap overhead (engine step with DEO_W swaps vs without, mlp, P = 10):")
    g = torch.Generator().manual_seed(0)
    model = build_model("mlp", tuple(ds.input_shape), ds.classes, generator=g)
    net = FunctionalNet(model)
    theta, _ = net.pack()

    def engine(scheme):
        target = NetworkTarget(net, ds.x_train, ds.y_train, strategy="vmap")
        est = NetworkEnergy(target, B)
        return PTEngine(target, NoiseLadder([0.0] * 10), MomentumSGD(est), scheme,
                        Deterministic(0.0), step_size=[1e-6 * (p + 1) for p in range(10)],
                        dtype=torch.float32, initial_states=theta.expand(1, 10, -1).clone())

    with_swaps, without = engine(DEOW(4)), engine(NoSwap())
    ts, tn = [], []
    for _ in range(args.repeats):
        tn.append(_median_time(without.step, 5))
        ts.append(_median_time(with_swaps.step, 5))
    a, b = statistics.median(ts), statistics.median(tn)
    print(f"  step with swaps {a * 1e3:.2f} ms, without {b * 1e3:.2f} ms: overhead "
          f"{100 * (a - b) / a:+.2f} % of a step")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def table(args) -> None:
    ds = load_dataset(args.dataset, seed=args.split_seed)
    methods = args.methods.split(",")
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    regression = ds.classes == 0
    # regression: test LL and NLL per example, RMSE, all in the targets' original units
    keys = ("test_ll", "nll_mean", "rmse") if regression else (
        "accuracy", "nll_mean", "nll_sum", "ece", "brier")
    extra = {"likelihood": "gaussian"} if regression else {}
    if args.weight_decay is not None:
        extra["weight_decay"] = args.weight_decay
    t_all = time.perf_counter()
    for seed in range(args.seeds):
        for m in methods:
            g = torch.Generator().manual_seed(rng.key(seed, rng.Stream.INIT, 0xDEE9))
            if regression:  # the MLP `nrpt deep --dataset diabetes` builds
                from nrpt.deep.cli import REGRESSION_HIDDEN
                from nrpt.deep.models import mlp

                model = mlp(ds.x_train[0].numel(), 1, REGRESSION_HIDDEN, generator=g)
            else:
                model = build_model(args.model, tuple(ds.input_shape), ds.classes, generator=g)
            # (the swap settings only to the methods that read them: DeepConfig refuses others)
            tempered = ({"swap_rate": args.swap_rate, "sa_pairs": args.sa_pairs}
                        if BUILDERS[m].tempered else {})
            t0 = time.perf_counter()
            res = fit(model, (ds.x_train, ds.y_train), (ds.x_test, ds.y_test), method=m,
                      chains=args.chains, epochs=args.epochs, seed=seed,
                      batch_size=args.batch, lr_min=args.lr_min, lr_max=args.lr_max,
                      pretrain_epochs=args.pretrain_epochs, augment=ds.augment,
                      strategy="vmap", **extra, **tempered)
            s = dict(res.summary)
            s["seconds"] = time.perf_counter() - t0
            rows[m].append(s)
            scores = " ".join(f"{k} {s[k]:.4f}" for k in keys)
            print(f"  seed {seed} {m:<9} {scores} rt {s['round_trips']} "
                  f"grads {s['gradient_evaluations']} ({s['seconds']:.0f} s)", flush=True)
    print(f"\n{args.dataset}, {args.model}, P = {args.chains}, {args.epochs} epochs x P budget, "
          f"{args.seeds} seeds (mean ± sd); total {time.perf_counter() - t_all:.0f} s")
    print(f"{'method':<10} " + " ".join(f"{k:>16}" for k in keys) + f" {'round trips':>12}")
    for m in methods:
        cells = []
        for k in keys:
            v = [r[k] for r in rows[m]]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):>8.4f} ± {sd:<6.4f}")
        rt = statistics.mean(float(r["round_trips"]) for r in rows[m])
        print(f"{m:<10} " + " ".join(cells) + f" {rt:>12.1f}")
    if regression and "ensemble" in rows and "deo-star" in rows:
        d = [a["test_ll"] - b["test_ll"] for a, b in zip(rows["deo-star"], rows["ensemble"],
                                                          strict=True)]
        r = [a["rmse"] - b["rmse"] for a, b in zip(rows["deo-star"], rows["ensemble"],
                                                    strict=True)]
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        print(f"\npaired, deo-star vs ensemble: test LL {statistics.mean(d):+.4f} nats per "
              f"example (sd {sd:.4f}; > 0: deo-star better), RMSE {statistics.mean(r):+.3f}; "
              f"deo-star better in {sum(x > 0 for x in d)} of {len(d)} seeds")
    elif "ensemble" in rows and "deo-star" in rows:
        d = [(a["nll_mean"] - b["nll_mean"]) / b["nll_mean"]
             for a, b in zip(rows["deo-star"], rows["ensemble"], strict=True)]
        e = [a["ece"] - b["ece"] for a, b in zip(rows["deo-star"], rows["ensemble"],
                                                  strict=True)]
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        print(f"\npaired, deo-star vs ensemble: NLL {100 * statistics.mean(d):+.2f} % "
              f"(sd {100 * sd:.2f} %), ECE {statistics.mean(e):+.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))


def windows(args) -> None:
    """Round trips with W* vs W = 1 (the paper's Fig. 7a / 8)."""
    ds = load_dataset(args.dataset, seed=args.split_seed)
    out = {"deo-star": [], "deo": []}
    for seed in range(args.seeds):
        for m in out:
            g = torch.Generator().manual_seed(rng.key(seed, rng.Stream.INIT, 0xDEE9))
            model = build_model(args.model, tuple(ds.input_shape), ds.classes, generator=g)
            res = fit(model, (ds.x_train, ds.y_train), (ds.x_test, ds.y_test), method=m,
                      chains=args.chains, epochs=args.epochs, seed=seed,
                      batch_size=args.batch, lr_min=args.lr_min, lr_max=args.lr_max,
                      swap_rate=args.swap_rate, pretrain_epochs=args.pretrain_epochs,
                      strategy="vmap", sa_pairs=args.sa_pairs)
            s = res.summary
            out[m].append(s)
            late = res.metrics[len(res.metrics) // 2:]  # the second half of the run

            def mean(key, rows=late):
                vals = [r[key] for r in rows if r.get(key) is not None]
                return statistics.mean(vals) if vals else float("nan")

            print(f"  seed {seed} {m:<9} second half: swaps per attempt {mean('swap_rate'):.4f}, "
                  f"verdicts of the pairs that could not swap {mean('verdict_rate_others'):.4f}; "
                  f"final C {s['correction']:.0f}")
            print(f"  seed {seed} {m:<9} W {s['window']:>4} round trips {s['round_trips']:>3} "
                  f"indicator rates {[round(r, 3) for r in s['indicator_rates']]} "
                  f"acceptance {[round(r or 0, 3) for r in s['swap_rates']]}", flush=True)
    a = statistics.mean(s["round_trips"] for s in out["deo-star"])
    b = statistics.mean(s["round_trips"] for s in out["deo"])
    print(f"\nround trips: W* {a:.1f}, W = 1 {b:.1f}, ratio {a / max(b, 1e-9):.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--repeats", type=int, default=7)
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--chains", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 10])
    t.add_argument("--compile", action="store_true")
    t.add_argument("--json", default=None)
    for name in ("table", "windows"):
        q = sub.add_parser(name)
        q.add_argument("--dataset", default="mnist1d", choices=["digits", "mnist1d", "diabetes"])
        q.add_argument("--weight-decay", type=float, default=None,
                       help="default: DeepConfig's (5e-4)")
        q.add_argument("--model", default="mlp")
        q.add_argument("--seeds", type=int, default=5)
        q.add_argument("--epochs", type=float, default=30)
        q.add_argument("--chains", type=int, default=4)
        q.add_argument("--batch", type=int, default=128)
        q.add_argument("--lr-min", type=float, default=0.01)
        q.add_argument("--lr-max", type=float, default=0.05)
        q.add_argument("--swap-rate", type=float, default=0.05)
        q.add_argument("--pretrain-epochs", type=float, default=5)
        q.add_argument("--split-seed", type=int, default=0)
        q.add_argument("--methods", default=",".join(METHODS))
        q.add_argument("--json", default=None)
        q.add_argument("--sa-pairs", default="attempted", choices=["all", "attempted"],
                       help="verdicts C and the learning rates are adapted on (adapt.sa)")
    args = p.parse_args(argv)
    {"throughput": throughput, "table": table, "windows": windows}[args.what](args)


if __name__ == "__main__":
    main()
