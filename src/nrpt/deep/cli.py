"""``nrpt deep``: tempered network replicas on a bundled dataset, from the command line.

    nrpt deep --dataset mnist1d --model mlp --method deo-star --chains 4 --epochs 40 \\
              --seed 0 --out runs/deep
    nrpt resume runs/deep            (or: nrpt deep --resume runs/deep)

The run folder gets ``cli.json`` (the command's settings, written first so that a resumption
can rebuild the data and the model), then what :func:`nrpt.deep.fit` writes (``run.json`` with
``kind = "deep"``: what ``nrpt resume`` recognises)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nrpt.deep.config import DeepConfig, declarations, known_options
from nrpt.deep.fitting import folder_lock
from nrpt.options import add_flags

__all__ = ["add_parser", "run", "is_deep_run", "resume", "resume_command"]

DATASETS = ("digits", "mnist1d", "cifar10", "cifar100", "synthetic-cifar")
MODELS = ("mlp", "cnn", "cnn1d", "resnet20", "resnet32", "resnet56")
#: a sensible model per dataset when --model is not given
DEFAULT_MODEL = {"digits": "mlp", "mnist1d": "mlp", "cifar10": "resnet20",
                 "cifar100": "resnet20", "synthetic-cifar": "resnet20"}
#: settings that suit each dataset where the command line does not say (DeepConfig's own
#: defaults are the paper's CIFAR-100 ones; on small data S = 0.005 makes W* longer than a run)
DATASET_DEFAULTS = {
    "digits": {"lr_min": 0.01, "lr_max": 0.05, "swap_rate": 0.05, "pretrain_epochs": 5.0},
    "mnist1d": {"lr_min": 0.01, "lr_max": 0.05, "swap_rate": 0.05, "pretrain_epochs": 5.0},
    "cifar10": {}, "cifar100": {}, "synthetic-cifar": {},
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
                   help="digits and mnist1d run offline; CIFAR reads --data-dir")
    p.add_argument("--model", choices=MODELS, default=None,
                   help="default: mlp for digits and mnist1d, resnet20 for CIFAR")
    p.add_argument("--out", default=None, help="run folder")
    p.add_argument("--data-dir", default=None,
                   help="CIFAR: the folder holding cifar-10-batches-py / cifar-100-python")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the interrupted run in DIR (other flags are ignored; the same as "
                        "`nrpt resume DIR`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    model = build_model(settings["model"], tuple(ds.input_shape), ds.classes, generator=g)
    return ds, model


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
    with folder_lock(args.out):
        return _start(args)


def is_deep_run(folder) -> bool:
    """Whether ``folder`` holds a deep run (``run.json`` says so, or ``nrpt deep`` wrote its
    ``cli.json`` there)."""
    from nrpt.run import folder as rf

    return rf.run_kind(folder) == "deep" or (Path(folder) / "cli.json").is_file()


def resume_command(args) -> int:
    """``nrpt resume DIR`` of a deep run (the options of sampler runs do not apply)."""
    given = [flag for flag, value in (("--iterations", args.iterations),
                                      ("--target", args.target), ("--threads", args.threads),
                                      ("--nproc", getattr(args, "nproc", None)))
             if value is not None]
    if given or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print(f"nrpt: error: {args.out} holds a deep run: {', '.join(given) or '--nproc'} "
              f"does not apply to it (its budget is its epochs; it runs on one process); "
              f"resume it with `nrpt resume {args.out}`", file=sys.stderr)
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
    with folder_lock(out):
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
    if out is not None:
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
    if out is not None and not resume:
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
    keys = ("method", "accuracy", "nll_mean", "nll_sum", "ece", "brier", "round_trips",
            "swap_rates", "learning_rates", "correction", "gradient_evaluations",
            "models_collected", "strategy", "wall_time_s")
    for k in keys:
        v = s.get(k)
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, list):
            v = "[" + ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in v) + "]"
        print(f"{k:>22}: {v}")
    if out is not None:
        print(f"{'run folder':>22}: {out}")
