"""Throughput of ``nrpt.deep.fit`` against the floor: a plain PyTorch loop training the same P
models (issue 23 item 2, issue 24's deep goal).

    python benchmarks/deep_speed.py [--cases mlp-digits,cnn-digits,resnet20-synthetic]
        [--device cpu|cuda] [--pairs 5] [--chains 4] [--batch 128] [--steps 40]
        [--strategy auto|loop|vmap|compile] [--strategy-cache fresh|off|machine]
        [--json out.json]

The floor (``plain``): ``P`` independent ``nn.Module`` copies, each with its own
``torch.optim.SGD(lr, momentum, weight_decay)``, every step drawing its own batch of ``batch``
examples from data held on the device, the same augmentation (the dataset's, batched, from a
generator on the device), forward, mean cross entropy, backward, step; and at the end of every
epoch each model's test-set logits (what a training script evaluates, and what
``nrpt.deep``'s per-epoch rows evaluate).  ``nrpt``: ``nrpt.deep.fit(method="deo-star",
chains=P, pretrain_epochs=0)`` with swaps, the adaptors and every recorder on (per-epoch rows,
model average, swap statistics, round trips, trace, index process) doing the same number of
gradient steps ``steps x P``.

Both sides run in this process, paired and interleaved (plain, nrpt, plain, nrpt, ...); the
figures are medians over ``--pairs`` pairs of wall time and CPU time (``time.process_time``,
all threads of the process); the ratio is ``plain time / nrpt time`` (>= 0.9 is the goal, 1.0
means no overhead).  ``nrpt fit`` is the whole call (set-up, the one initial gradient, the
final average included); ``nrpt loop`` its sampling loop alone (``_Job.execute``, wall and
CPU: this benchmark wraps it).  Cases: ``mlp-digits`` / ``cnn-digits`` (scikit-learn's digits) and
``resnet20-synthetic`` (ResNet-20 on ``synthetic-cifar``: random 3x32x32 images, 100 classes,
CIFAR's augmentation).  ``--train`` / ``--test`` cut the data (on CPU ResNet-20 runs
24 steps at batch 32 on 768 / 128 examples by default: a pair near 30 s); ``--device cuda``
puts the data and the models on the GPU;
``--precision bf16`` is passed to fit where it takes one (and autocast on the floor).

``--strategy-cache``: where ``auto`` remembers its loop / vmap timings
(``NRPT_DEEP_STRATEGY_CACHE``, :func:`nrpt.deep.replicas.strategy_cache`): ``fresh`` (default) a
new file in a temporary folder, filled by the untimed warm-up fit, so the timed fits are a later
run of the model on this machine; ``off`` every fit probes (a model's first run); ``machine``
the machine's own file.

Run with OMP_NUM_THREADS=1 on CPU (``make bench-deep-speed``)."""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nrpt import rng  # noqa: E402
from nrpt.deep.data import load_dataset  # noqa: E402
from nrpt.deep.fitting import fit  # noqa: E402
from nrpt.deep.models import build_model  # noqa: E402

#: case -> (model, dataset)
CASES = {"mlp-digits": ("mlp", "digits"), "cnn-digits": ("cnn", "digits"),
         "resnet20-synthetic": ("resnet20", "synthetic-cifar")}
LR, MOMENTUM, WD = 0.02, 0.9, 5e-4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    _sync(device)
    return time.perf_counter() - w0, time.process_time() - c0, out


def plain(models, data, augment, *, steps, batch, per_epoch, device, seed, bf16=False):
    """The floor: ``steps`` momentum-SGD steps of each model (one after the other, as a plain
    loop over P models is written), each model's test logits at every epoch's end."""
    xtr, ytr, xte, _ = data
    N = ytr.shape[0]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
            for m in models]
    g = torch.Generator(device=device).manual_seed(seed)
    for k in range(steps):
        for m, opt in zip(models, opts, strict=True):
            m.train()
            idx = torch.randint(N, (batch,), generator=g, device=device)
            xb, yb = xtr[idx], ytr[idx]
            if augment is not None:
                xb = augment(xb, g)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(m(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if (k + 1) % per_epoch == 0:
            with torch.no_grad():
                for m in models:
                    m.eval()
                    for xs in xte.split(1024):
                        m(xs)
    return None


#: (wall, cpu) seconds of each nrpt sampling loop (``_Job.execute``), measured by the wrapper
#: :func:`_timed_loops` installs (the benchmark's instrumentation, not nrpt's)
LOOPS: list[tuple[float, float]] = []


def _timed_loops() -> None:
    from nrpt.deep import fitting

    plain_execute = fitting._Job.execute

    def execute(self, run, out, resume):
        _sync(self.dev)
        w0, c0 = time.perf_counter(), time.process_time()
        outcome = plain_execute(self, run, out, resume)
        _sync(self.dev)
        LOOPS.append((time.perf_counter() - w0, time.process_time() - c0))
        return outcome

    fitting._Job.execute = execute


def nrpt_fit(model, data, augment, *, steps, batch, per_epoch, chains, strategy, seed,
             device, precision):
    xtr, ytr, xte, yte = data
    extra = {} if precision == "fp32" else {"precision": precision}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs: the few-round-trips warning
        res = fit(model, (xtr, ytr), (xte, yte), method="deo-star", chains=chains,
                  epochs=steps / per_epoch, seed=seed, batch_size=batch, lr_min=LR / 2,
                  lr_max=LR, swap_rate=0.05, pretrain_epochs=0, burn_in=0.0, augment=augment,
                  strategy=strategy, device=str(device), **extra)
    assert res.summary["iterations"] == steps, res.summary["iterations"]
    return res


def run_case(case, args, device):
    model_name, ds_name = CASES[case]
    ds = load_dataset(ds_name, seed=0)
    n_tr = min(args.train or ds.x_train.shape[0], ds.x_train.shape[0])
    n_te = min(args.test or ds.x_test.shape[0], ds.x_test.shape[0])
    data = tuple(t.to(device) for t in (ds.x_train[:n_tr], ds.y_train[:n_tr],
                                        ds.x_test[:n_te], ds.y_test[:n_te]))
    batch, P = min(args.batch, n_tr), args.chains
    per_epoch = math.ceil(n_tr / batch)
    g = torch.Generator().manual_seed(rng.key(0, rng.Stream.INIT, 0xDEE9))
    model = build_model(model_name, tuple(ds.input_shape), ds.classes, generator=g).to(device)
    augment = ds.augment
    steps = args.steps

    def floor():
        models = [copy.deepcopy(model) for _ in range(P)]
        return plain(models, data, augment, steps=steps, batch=batch, per_epoch=per_epoch,
                     device=device, seed=0, bf16=args.precision == "bf16")

    def ours():
        return nrpt_fit(model, data, augment, steps=steps, batch=batch, per_epoch=per_epoch,
                        chains=P, strategy=args.strategy, seed=0, device=device,
                        precision=args.precision)

    # warm-up of both (first-call allocations, cuDNN autotuning, lazy imports)
    _timed(floor, device)
    _, _, res = _timed(ours, device)
    rows = []
    for _ in range(args.pairs):
        wp, cp, _ = _timed(floor, device)
        wn, cn, res = _timed(ours, device)
        lw, lc = LOOPS[-1]
        rows.append({"plain_wall": wp, "plain_cpu": cp, "nrpt_wall": wn, "nrpt_cpu": cn,
                     "nrpt_loop_wall": lw, "nrpt_loop_cpu": lc})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratio = {k: statistics.median(r[f"plain_{k.removeprefix('loop_')}"] / r[f"nrpt_{k}"]
                                  for r in rows)
             for k in ("wall", "cpu", "loop_wall", "loop_cpu")}
    grads = steps * P
    out = {"case": case, "device": str(device), "P": P, "batch": batch, "steps": steps,
           "train": n_tr, "test": n_te, "strategy": res.summary["strategy"],
           "strategy_cache": args.strategy_cache,
           "precision": args.precision, "pairs": args.pairs, "median_s": med,
           "ratio_plain_over_nrpt": ratio,
           "grad_steps_per_s": {"plain": grads / med["plain_wall"],
                                "nrpt_fit": grads / med["nrpt_wall"],
                                "nrpt_loop": grads / med["nrpt_loop_wall"]},
           "pairs_raw": rows}
    print(f"{case:<19} {str(device):<6} P={P:<2} B={batch:<4} steps={steps:<4} "
          f"{res.summary['strategy']:<7} {args.precision:<4} "
          f"{'cached' if 'remembered' in res.summary['strategy_timings_s'] else 'probed'} | "
          f"plain {med['plain_wall']:7.2f} s ({med['plain_cpu']:7.2f} cpu) "
          f"nrpt {med['nrpt_wall']:7.2f} s ({med['nrpt_cpu']:7.2f} cpu) "
          f"loop {med['nrpt_loop_wall']:7.2f} s ({med['nrpt_loop_cpu']:7.2f} cpu) | plain/nrpt "
          f"fit wall {ratio['wall']:.3f} cpu {ratio['cpu']:.3f}, loop wall "
          f"{ratio['loop_wall']:.3f} cpu {ratio['loop_cpu']:.3f} | "
          f"grad steps/s plain {grads / med['plain_wall']:.1f} "
          f"nrpt {grads / med['nrpt_wall']:.1f}", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=None,
                   help="gradient steps per replica (default: 40; resnet20 on CPU: 24)")
    p.add_argument("--train", type=int, default=None, help="training examples kept")
    p.add_argument("--test", type=int, default=None, help="test examples kept")
    p.add_argument("--strategy", default="auto", choices=["auto", "loop", "vmap", "compile"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--strategy-cache", default="fresh", choices=["fresh", "off", "machine"],
                   help="auto's remembered timings: a fresh file (filled by the warm-up), "
                        "off (every fit probes), or the machine's own")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.strategy_cache == "off":
        os.environ["NRPT_DEEP_STRATEGY_CACHE"] = "0"
    elif args.strategy_cache == "fresh":
        os.environ["NRPT_DEEP_STRATEGY_CACHE"] = os.path.join(
            tempfile.mkdtemp(prefix="nrpt-deep-speed-"), "deep-strategy.json")
    device = torch.device(args.device)
    _timed_loops()
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"threads {torch.get_num_threads()}"
          + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    results = []
    for case in args.cases.split(","):
        if case not in CASES:
            raise SystemExit(f"--cases: {case!r} is not one of {', '.join(CASES)}")
        small_cpu = case.startswith("resnet") and device.type == "cpu"
        a = argparse.Namespace(**vars(args))
        a.steps = args.steps or (24 if small_cpu else 40)
        if small_cpu:  # one thread: a ResNet-20 step of P = 4 at batch 32 is about 0.6 s
            a.train = args.train or 768
            a.test = args.test or 128
            a.batch = 32 if args.batch == 128 else args.batch
        results.append(run_case(case, a, device))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
