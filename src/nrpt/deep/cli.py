"""``nrpt deep``: tempered network replicas on a bundled dataset, from the command line.

    nrpt deep --dataset mnist1d --model mlp --method deo-star --chains 4 --epochs 40 \\
              --seed 0 --out runs/deep
    nrpt resume runs/deep            (or: nrpt deep --resume runs/deep)
    nrpt deep ... --nproc 4          (replicas over 4 local processes; or
                                      torchrun --nproc-per-node 4 -m nrpt deep ...)

The run folder gets ``cli.json`` (the command's settings, written first so that a resumption
can rebuild the data and the model), then what :func:`nrpt.deep.fit` writes (``run.json`` with
``kind = "deep"``: what ``nrpt resume`` recognises).  With several processes rank 0 owns the
folder and prints; the others read ``cli.json`` from it when resuming (one machine, or a
shared file system)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nrpt.deep.config import DeepConfig, declarations, known_options
from nrpt.deep.fitting import folder_lock
from nrpt.options import add_flags

__all__ = ["add_parser", "run", "is_deep_run", "resume", "resume_command", "check_launch"]

DATASETS = ("digits", "mnist1d", "cifar10", "cifar100", "synthetic-cifar", "diabetes")
MODELS = ("mlp", "cnn", "cnn1d", "resnet20", "resnet32", "resnet56")
#: a sensible model per dataset when --model is not given
DEFAULT_MODEL = {"digits": "mlp", "mnist1d": "mlp", "cifar10": "resnet20",
                 "cifar100": "resnet20", "synthetic-cifar": "resnet20", "diabetes": "mlp"}
#: regression sets: the MLP of the UCI benchmarks (one hidden layer of 50 ReLU units; Hernandez-
#: Lobato & Adams 2015), one output (the mean), a Gaussian likelihood with learned noise
REGRESSION_HIDDEN = (50,)
#: settings that suit each dataset where the command line does not say (DeepConfig's own
#: defaults are the paper's CIFAR-100 ones; on small data S = 0.005 makes W* longer than a run)
DATASET_DEFAULTS = {
    "digits": {"lr_min": 0.01, "lr_max": 0.05, "swap_rate": 0.05, "pretrain_epochs": 5.0},
    "mnist1d": {"lr_min": 0.01, "lr_max": 0.05, "swap_rate": 0.05, "pretrain_epochs": 5.0},
    "cifar10": {}, "cifar100": {}, "synthetic-cifar": {},
    # 354 examples, batch 32: 12 iterations per epoch (docs/reproduction/deep.md, regression)
    "diabetes": {"likelihood": "gaussian", "batch_size": 32, "lr_min": 0.002, "lr_max": 0.01,
                 "swap_rate": 0.05, "pretrain_epochs": 50.0, "weight_decay": 0.1,
                 "epochs": 100.0},
}

#: the settings ``cli.json`` holds beside its ``options`` (fit's own arguments)
_FIT = ("method", "chains", "epochs", "seed")
#: what ``nrpt deep`` runs where the command line does not say (DeepConfig's default: 10)
CLI_DEFAULTS = {"epochs": 30.0}


def _help(opt) -> str:
    value = CLI_DEFAULTS.get(opt.name, opt.default)
    small = DATASET_DEFAULTS["digits"].get(opt.name)
    if value is None:
        return opt.help
    return opt.help + f" (default {value!r}" + (
        f"; {small!r} on digits and mnist1d)" if small is not None else ")")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("deep", help="tempered network replicas (DEO*-mSGD and baselines) on "
                                    "digits / MNIST-1D / CIFAR, evaluated as a model average",
                       description="Settings not given take nrpt.deep.DeepConfig's defaults "
                                   "(the paper's CIFAR-100 ones), except on digits and mnist1d: "
                                   "lr 0.01-0.05, swap rate 0.05, 5 pretraining epochs (the "
                                   "settings of docs/reproduction/deep.md).  A setting the "
                                   "chosen --method does not read is an error.")
    p.add_argument("--dataset", choices=DATASETS, default="mnist1d",
                   help="digits, mnist1d and diabetes run offline; CIFAR reads --data-dir.  "
                        "diabetes is a regression (defaults: likelihood gaussian, batch 32, "
                        "lr 0.002-0.01, weight decay 0.1, 50 pretraining epochs, 100 epochs, "
                        "swap rate 0.05)")
    p.add_argument("--model", choices=MODELS, default=None,
                   help="default: mlp for digits, mnist1d and diabetes (one hidden layer of 50), "
                        "resnet20 for CIFAR")
    p.add_argument("--out", default=None, help="run folder")
    p.add_argument("--data-dir", default=None,
                   help="CIFAR: the folder holding cifar-10-batches-py / cifar-100-python")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the interrupted run in DIR (other flags are ignored; the same as "
                        "`nrpt resume DIR`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="spread the replicas over N local processes (torch.distributed: gloo, "
                        "one GPU each with --device cuda); a checkpoint resumes on any number; "
                        "for a fixed seed the results do not depend on N (bit for bit on CPU "
                        "with --strategy loop, what auto takes with N > 1)")
    p.add_argument("--max-seconds", type=_seconds, default=None, metavar="S",
                   help="wall-clock budget of this session, pretraining included: when it is "
                        "spent the run stops at the next iteration with a checkpoint and its "
                        "outputs, resumable (`nrpt resume DIR` gives each session the same "
                        "budget; `nrpt deep --resume DIR --max-seconds S` another)")
    add_flags(p, ((o, "settings (nrpt.deep.DeepConfig)" if names is None else
                   f"settings of method{'s' if len(names) > 1 else ''} {', '.join(names)}")
                  for o, names in declarations()), describe=_help)
    return p


def _build(settings: dict):
    import torch

    from nrpt import rng
    from nrpt.deep.data import load_dataset
    from nrpt.deep.models import build_model

    ds = load_dataset(settings["dataset"], root=settings.get("data_dir"),
                      seed=settings["seed"])
    g = torch.Generator().manual_seed(rng.key(settings["seed"], rng.Stream.INIT, 0xDEE9))
    if ds.classes == 0:  # a regression set
        if settings["model"] != "mlp":
            raise ValueError(f"dataset {settings['dataset']} is a regression set: --model mlp "
                             f"only (got {settings['model']!r})")
        from nrpt.deep.models import mlp

        return ds, mlp(ds.x_train[0].numel(), 1, REGRESSION_HIDDEN, generator=g)
    model = build_model(settings["model"], tuple(ds.input_shape), ds.classes, generator=g)
    return ds, model


def check_launch(args, nproc: int) -> None:
    """Before ``--nproc N`` starts any process: a deep run (new, or resumed from its
    ``cli.json``) can be spread over ``nproc`` processes (at most one per chain; a method of
    several chains), else the ``ValueError`` naming why."""
    from nrpt.core.sharding import check_world
    from nrpt.deep.methods import BUILDERS

    if args.command == "deep" and not args.resume:
        known = known_options()
        method = args.method or known["method"].default
        chains = args.chains or known["chains"].default
    else:
        folder = Path(args.resume if args.command == "deep" else args.out)
        try:
            settings = json.loads((folder / "cli.json").read_text())
        except (OSError, ValueError):
            return  # (the resumption's own checks name what is wrong)
        method, chains = settings.get("method"), settings.get("chains")
    if method in BUILDERS and BUILDERS[method].single:
        raise ValueError(f"method {method!r} runs one chain, in one process: run it without "
                         f"--nproc")
    if isinstance(chains, int):
        check_world(nproc, chains)


def _lead() -> bool:
    """Whether this process owns the run folder (rank 0 of a multi-process launch)."""
    return int(os.environ.get("RANK", "0")) == 0
def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"--max-seconds must be a number of seconds > 0; "
                                         f"got {text!r}")
    return value


def run(args) -> int:
    """``nrpt deep``: a new run, or with ``--resume DIR`` the resumption of one."""
    if args.resume:
        return resume(args.resume, progress=not args.no_progress,
                      max_seconds=getattr(args, "max_seconds", None))
    # the folder's lock from before cli.json is written to the end of the run: a second run
    # or resume of the same folder is refused (RunFolderBusy: nrpt: error ...)
    with folder_lock(args.out if _lead() else None):
        return _start(args)


def is_deep_run(folder) -> bool:
    """Whether ``folder`` holds a deep run (``run.json`` says so, or ``nrpt deep`` wrote its
    ``cli.json`` there)."""
    from nrpt.run import folder as rf

    return rf.run_kind(folder) == "deep" or (Path(folder) / "cli.json").is_file()


def resume_command(args) -> int:
    """``nrpt resume DIR`` of a deep run (the options of sampler runs do not apply)."""
    given = [flag for flag, value in (("--iterations", args.iterations),
                                      ("--target", args.target), ("--threads", args.threads))
             if value is not None]
    if given:
        print(f"nrpt: error: {args.out} holds a deep run: {', '.join(given)} does not apply "
              f"to it (its budget is its epochs); resume it with `nrpt resume {args.out}` "
              f"(--nproc N: on N processes)", file=sys.stderr)
        return 2
    return resume(args.out, progress=not args.no_progress)


def resume(folder, progress: bool = True, max_seconds: float | None = None) -> int:
    """Continue the deep run in ``folder`` (started by ``nrpt deep``: its ``cli.json`` rebuilds
    the data and the model; ``max_seconds``: this session's budget, default the one the run
    was started with); its exit status."""
    out = Path(folder)
    if not out.is_dir():
        print(f"nrpt: error: {out} holds no `nrpt deep` run (no such folder)", file=sys.stderr)
        return 2
    with folder_lock(out if _lead() else None):
        if not (out / "cli.json").exists():
            why = ("it was started from Python (nrpt.deep.fit), which keeps no model or data "
                   "in the folder: resume it with nrpt.deep.fit(..., out=DIR, resume=True)"
                   if is_deep_run(out) else "cli.json missing")
            print(f"nrpt: error: {out} holds no `nrpt deep` run to resume ({why})",
                  file=sys.stderr)
            return 2
        settings = json.loads((out / "cli.json").read_text())
        if max_seconds is not None:
            settings["max_seconds"] = max_seconds
        return _fit_and_report(settings, out, resume=True, progress=progress)


def _settings(args) -> dict:
    """``cli.json``: the data, the model, and the settings given, over the CLI's and the
    dataset's defaults of the settings the method reads (the others' are dropped)."""
    known = known_options()
    given = {n: getattr(args, n) for n in known if getattr(args, n) is not None}
    method = given.get("method", known["method"].default)
    reads = {o.name for o, names in declarations() if names is None or method in names}
    defaults = {**{n: known[n].default for n in ("method", "chains", "seed")}, **CLI_DEFAULTS,
                **DATASET_DEFAULTS[args.dataset]}
    options = {**{n: v for n, v in defaults.items() if n in reads}, **given}
    return {"dataset": args.dataset, "model": args.model or DEFAULT_MODEL[args.dataset],
            "data_dir": args.data_dir, "max_seconds": getattr(args, "max_seconds", None),
            **{n: options.pop(n) for n in _FIT}, "options": options}


def _start(args) -> int:
    from nrpt.run import folder as rf

    settings = _settings(args)
    # bad values fail here, before any data is loaded
    DeepConfig(**settings["options"], **{n: settings[n] for n in _FIT})
    out = Path(args.out) if args.out else None
    if out is not None and _lead():
        rf.check_folder_name(out)  # before anything is created (or loaded)
        if any((out / name).exists() for name in (rf.RUN_JSON, rf.CHECKPOINT)):
            print(f"nrpt: error: {out} already holds a run; `nrpt resume {out}` or choose "
                  f"another --out", file=sys.stderr)
            return 2
    return _fit_and_report(settings, out, resume=False, progress=not args.no_progress)


def _fit_and_report(settings: dict, out: Path | None, *, resume: bool, progress: bool) -> int:
    from nrpt.deep.fitting import fit
    from nrpt.run import folder as rf

    ds, model = _build(settings)
    if out is not None and not resume and _lead():
        out.mkdir(parents=True, exist_ok=True)
        rf.atomic_write(out / "cli.json", json.dumps(settings, indent=2), sync=False)
    say = None
    if progress:
        from tqdm.auto import tqdm

        say = tqdm.write
    res = fit(model, (ds.x_train, ds.y_train), (ds.x_test, ds.y_test),
              method=settings["method"], chains=settings["chains"], epochs=settings["epochs"],
              seed=settings["seed"], out=out, progress=progress, augment=ds.augment,
              resume=resume, say=say, max_seconds=settings.get("max_seconds"),
              **settings["options"])
    if not _lead():
        return 130 if res.summary.get("interrupted") else 0
    _print_summary(res.summary, out)
    if res.summary.get("stopped_by") == "max_seconds":
        print(f"stopped by --max-seconds ({settings['max_seconds']:g} s); continue with: "
              f"nrpt resume {out}" if out else "stopped by --max-seconds (no --out: not "
              "resumable)")
        return 0
    if res.summary.get("interrupted"):
        print(f"interrupted; continue with: nrpt resume {out}" if out else "interrupted")
        return 130
    return 0


def _print_summary(s: dict, out: Path | None) -> None:
    keys = ("method", "accuracy", "test_ll", "rmse", "noise", "nll_mean", "nll_sum", "ece",
            "brier", "round_trips",
            "swap_rates", "learning_rates", "correction", "gradient_evaluations",
            "models_collected", "strategy", "wall_time_s")
    for k in keys:
        if k not in s:  # (a regression summary has no accuracy, a classifier's no rmse)
            continue
        v = s.get(k)
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, list):
            v = "[" + ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in v) + "]"
        print(f"{k:>22}: {v}")
    if out is not None:
        print(f"{'run folder':>22}: {out}")
