"""Command line: ``nrpt run`` (flags or a TOML config), ``nrpt resume DIR``, ``nrpt targets``.

Flags mirror :class:`nrpt.config.RunConfig` field by field; a flag given on the command line
overrides the same key of ``--config FILE``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from .config import RunConfig

_HELP = {
    "target": "built-in target name or path/to/file.py:NAME (see `nrpt targets`)",
    "chains": "number of slots P on the ladder (>= 2)",
    "iterations": "number of PT iterations (explore + swap)",
    "scheme": "swap scheme: adj, seo, deo, deo-w, ape",
    "window": "window W of deo-w (integer >= 1) or 'auto' for W* from the measured rejection",
    "explorer": "local move: rwmh, mala, hmc",
    "step_size": "step size at slot 0 (scaled by sqrt(tau) up a temperature ladder), "
                 "or one per slot, comma-separated",
    "leapfrog_steps": "leapfrog steps of hmc",
    "n_explore": "explorer steps per iteration",
    "max_temperature": "hottest temperature of the default geometric temperature ladder",
    "temperatures": "explicit temperature ladder, comma-separated, starting at 1",
    "betas": "explicit geometric-path schedule, comma-separated, from 1 down to 0",
    "systems": "independent PT systems run side by side (repeats)",
    "seed": "run seed (runs are bit-for-bit reproducible on one machine)",
    "thin": "record every thin-th target-slot draw",
    "window_tune": "iterations of DEO used to measure the rejection rate for --window auto "
                   "(default: iterations / 10)",
    "dtype": "float64 or float32",
    "device": "torch device, e.g. cpu or cuda",
    "checkpoint_every": "write a checkpoint every this many iterations",
    "out": "run folder (config.toml, summary.json, samples.npy, index.npy, checkpoint.pt)",
}


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def _step(text: str):
    vals = _floats(text)
    return vals[0] if len(vals) == 1 else vals


def _window(text: str):
    return "auto" if text == "auto" else int(text)


_TYPES = {"chains": int, "iterations": int, "leapfrog_steps": int, "n_explore": int,
          "systems": int, "seed": int, "thin": int, "window_tune": int, "checkpoint_every": int,
          "max_temperature": float, "temperatures": _floats, "betas": _floats,
          "step_size": _step, "window": _window}
_CHOICES = {"scheme": ["adj", "seo", "deo", "deo-w", "ape"], "explorer": ["rwmh", "mala", "hmc"],
            "dtype": ["float64", "float32"]}


# -- round-based adaptive NRPT (nrpt.rounds, docs/adaptive.md)


def _bool(text: str) -> bool:
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")
    return value[text.lower()]


_HELP.update({
    "rounds": "adaptive NRPT in N rounds of 2, 4, ..., 2^N iterations (replaces --iterations); "
              "the schedule is re-fitted between rounds, the report uses the last round; the "
              "explorer defaults to slice",
    "adapt_schedule": "with --rounds: re-fit the schedule between rounds (true/false)",
    "adapt_step_size": "with --rounds: tune rwmh/mala/hmc step sizes towards "
                       "--target-acceptance between rounds (true/false)",
    "target_acceptance": "explorer acceptance aimed at by --adapt-step-size "
                         "(default 0.3 rwmh, 0.57 mala, 0.65 hmc)",
    "slice_method": "interval growth of the slice explorer: stepping-out or doubling",
    "figures": "with --rounds and --out: write figures and an ArviZ netCDF file (true/false)",
})
_TYPES.update({"rounds": int, "adapt_schedule": _bool, "adapt_step_size": _bool,
               "target_acceptance": float, "figures": _bool})
_CHOICES["explorer"] = [*_CHOICES["explorer"], "slice"]
_CHOICES["slice_method"] = ["stepping-out", "doubling"]

# -- stochastic-gradient PT (nrpt.sgpt, docs/sgpt.md); `nrpt run` defaults to the headline preset
_SG_NAMES = ["sgld", "sgd", "sghmc", "msgd", "psgld", "psgd"]
_HELP.update({
    "swap_rule": "swap rule: auto (metropolis for exact explorers, deterministic for "
                 "sgd/msgd/psgd, bias-corrected for sgld/sghmc/psgld), metropolis, deterministic "
                 "(Eq. 7: "
                 "U_hi + C < U_lo), bias-corrected (reSGLD)",
    "swap_rate": "target swap rate S in (0, 1) of the C and learning-rate adaptors; also sets "
                 "W = ceil((log P + log log P) / -log(1 - S)) for --window auto",
    "lr_min": "learning rate of slot 0 (stochastic-gradient explorers)",
    "lr_max": "learning rate of slot P-1; the initial ladder is geometric in between",
    "learning_rates": "explicit initial learning-rate ladder, comma-separated, increasing",
    "noise_sd": "noisy oracle: sd of the Gaussian noise added to the energy (and gradient)",
    "grad_noise_sd": "noisy oracle: gradient noise sd if different from --noise-sd",
    "correction": "initial correction buffer C0 of the deterministic rule",
    "adapt": "adapt C and the learning rates online (deterministic rule) or track sigma^2 "
             "(bias-corrected rule) (true/false)",
    "sa_step": "SA step sizes gamma_k = a / (k^kappa + b) as a,kappa,b (default 50,0.8,500)",
    "bottom_temperature": "sgd/msgd/psgd: Langevin noise temperature at slot 0 (0: plain SGD)",
    "batch_size": "minibatch size (data targets); must not exceed the data",
    "vr_every": "variance-reduced energies: refresh the control-variate anchor every m "
                "iterations (0: off)",
    "variance_factor": "bias-corrected rule: divide the sigma^2 correction by F >= 1",
    "variance_every": "bias-corrected rule: refresh the per-slot sigma^2 every m iterations",
    "momentum": "momentum of sghmc / msgd (1 - friction)",
    "domain": "reflect stochastic-gradient steps onto box:LO,HI or ball:R",
})
_TYPES.update({"swap_rate": float, "lr_min": float, "lr_max": float, "learning_rates": _floats,
               "noise_sd": float, "grad_noise_sd": float, "correction": float, "adapt": _bool,
               "sa_step": _floats, "bottom_temperature": float, "batch_size": int,
               "vr_every": int, "variance_factor": float, "variance_every": int,
               "momentum": float})
_CHOICES["explorer"] = [*_CHOICES["explorer"], *_SG_NAMES]
_CHOICES["swap_rule"] = ["auto", "metropolis", "deterministic", "bias-corrected"]
PRESETS = ("deo-star-sgd", "none")


def _apply_preset(args, data: dict) -> dict:
    """``nrpt run`` starts from the headline DEO*-SGD x P16 run (nrpt.sgpt.HEADLINE) unless a
    config file, --rounds, --target or a full-batch --explorer is given (or --preset none);
    flags override it (e.g. --window 1 is DEO-SGD x P16)."""
    preset = args.preset
    if preset is None:
        exact = args.explorer is not None and args.explorer not in _SG_NAMES
        own = args.config or getattr(args, "rounds", None) is not None or args.target or exact
        preset = "none" if own else "deo-star-sgd"
    if preset == "none":
        return data
    from .sgpt import HEADLINE

    base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HEADLINE.items()}
    if "target" in data and data["target"] != base["target"]:
        base.pop("target_options")  # the preset's options belong to its own target
    if data.get("scheme") not in (None, "deo", "deo-w") and "window" not in data:
        base["window"] = 1  # 'auto' is a window of deo-w
    base.update(data)
    return base


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nrpt", description="Non-reversible parallel tempering.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run PT (default: the 25-mode 2-D target with DEO)")
    run.add_argument("--config", help="TOML file with RunConfig fields; flags override it")
    run.add_argument("--preset", choices=PRESETS, default=None,
                     help="starting configuration: deo-star-sgd (the paper's headline DEO*-SGD x "
                          "P16 run; the default without --config/--rounds/--target/full-batch "
                          "--explorer) or none (RunConfig defaults)")
    for f in fields(RunConfig):
        if f.name == "target_options":
            continue
        flag = "--" + f.name.replace("_", "-")
        run.add_argument(flag, dest=f.name, default=None, type=_TYPES.get(f.name, str),
                         choices=_CHOICES.get(f.name), help=_HELP.get(f.name))
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for the target factory (repeatable)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    res = sub.add_parser("resume", help="continue an interrupted run from its folder")
    res.add_argument("out")
    res.add_argument("--no-progress", action="store_true")
    sub.add_parser("targets", help="list the built-in targets")
    return p


def _literal(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import api

    try:
        if args.command == "targets":
            from .target import BUILTIN_TARGETS

            for name in sorted(BUILTIN_TARGETS):
                print(name)
            return 0
        if args.command == "resume":
            result = api.resume(args.out, progress=not args.no_progress)
            print(result)
            return 0
        data = {}
        if args.config:
            data.update(RunConfig.from_toml(args.config).to_dict())
        for f in fields(RunConfig):
            v = getattr(args, f.name, None)
            if v is not None:
                data[f.name] = v
        opts = dict(data.get("target_options") or {})
        for item in args.option:
            if "=" not in item:
                raise ValueError(f"--option must be KEY=VALUE; got {item!r}")
            key, value = item.split("=", 1)
            opts[key] = _literal(value)
        data["target_options"] = opts
        if not opts:
            data.pop("target_options")
        data = _apply_preset(args, data)
        if data.get("rounds") is not None and args.explorer is None and not args.config:
            data["explorer"] = "slice"  # adaptive runs: the gradient-free default explorer
        cfg = RunConfig.from_dict(data)
        result = api._run(cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:
        print(f"nrpt: error: {err}", file=sys.stderr)
        return 2
    print(result)
    if result.summary.get("interrupted"):
        print(f"interrupted; continue with: nrpt resume {cfg.out}" if cfg.out else "interrupted")
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
