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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nrpt", description="Non-reversible parallel tempering.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run PT (default: the 25-mode 2-D target with DEO)")
    run.add_argument("--config", help="TOML file with RunConfig fields; flags override it")
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
