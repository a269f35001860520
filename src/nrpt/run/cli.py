"""Command line: ``nrpt run`` (flags or a TOML config), ``nrpt resume DIR``, ``nrpt list``.

Exit status: 0 done, 2 an error the user can fix (``nrpt: error: ...``), 130 interrupted (Ctrl-C
or SIGTERM: the run checkpointed and wrote its outputs; continue with ``nrpt resume DIR``).

Flags mirror :class:`nrpt.run.config.RunConfig` field by field; a flag given on the command line
overrides the same key of ``--config FILE``.  The names offered for ``--explorer``,
``--scheme``, ``--swap-rule`` and ``--target`` come from :mod:`nrpt.run.registry`.  Every error a
user can cause is printed as ``nrpt: error: ...`` (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import fields

from nrpt.paths.variational import REFERENCES
from nrpt.report.health import SamplingWarning
from nrpt.run import registry
from nrpt.run.config import DTYPES, SECTIONS, SLICE_METHODS, RunConfig

_HELP = {
    "target": "built-in target name or path/to/file.py:NAME (see `nrpt list targets`)",
    "chains": "number of slots P on the ladder (>= 2)",
    "iterations": "number of PT iterations (explore + swap)",
    "burn_in": "warm-up of a fixed-length run, in no statistic and not in posterior.nc: a "
               "fraction of --iterations in [0, 1) (default 0.1) or a count (an integer); "
               "rwmh/mala/hmc step sizes are tuned during it and then frozen",
    "scheme": "swap scheme",
    "window": "window W of deo-w: an integer >= 1, 'auto' (W* from the rejection rate measured "
              "in a DEO tuning segment) or 'swap-rate' (W* from r = 1 - swap_rate); for noisy / "
              "stochastic-gradient swaps: a window > 1 with exact Metropolis swaps is refused "
              "(biased; use --scheme deo)",
    "explorer": "local move (exact: rwmh, mala, hmc, slice; stochastic-gradient: the rest)",
    "step_size": "exact explorers: step size at slot 0 (scaled by sqrt(tau) up a temperature "
                 "ladder), or one per slot, comma-separated",
    "leapfrog_steps": "leapfrog steps of hmc",
    "n_explore": "explorer steps per iteration",
    "max_temperature": "hottest temperature of the default geometric temperature ladder",
    "temperatures": "explicit temperature ladder, comma-separated, starting at 1",
    "betas": "explicit geometric-path schedule, comma-separated, from 1 down to 0",
    "systems": "independent PT systems run side by side (repeats)",
    "seed": "run seed in [0, 2^64) (runs are bit-for-bit reproducible on one machine)",
    "thin": "record every thin-th target-slot draw",
    "window_tune": "iterations of DEO that measure the rejection rate for --window auto "
                   "(default: iterations / 10)",
    "dtype": "floating-point precision",
    "device": "torch device: cpu, cuda, cuda:N",
    "checkpoint_every": "write a checkpoint every this many iterations",
    "out": "run folder (config.toml, summary.json, samples.npy, index.npy, checkpoint.pt, "
           "posterior.nc, figures)",
    "rounds": "adaptive NRPT in N rounds of 2, 4, ..., 2^N iterations (replaces --iterations); "
              "the schedule is re-fitted between rounds, the report uses the last round; the "
              "explorer defaults to slice",
    "adapt_schedule": "with --rounds: re-fit the schedule between rounds (true/false)",
    "adapt_step_size": "with --rounds: tune rwmh/mala/hmc step sizes (slice widths) between "
                       "rounds; in a fixed-length run: tune rwmh/mala/hmc step sizes during "
                       "the burn-in (true/false, default true)",
    "target_acceptance": "explorer acceptance aimed at by --adapt-step-size "
                         "(default 0.3 rwmh, 0.574 mala, 0.65 hmc)",
    "slice_method": "interval growth of the slice explorer",
    "reference": "hot end of a geometric path: prior (default), or with --rounds a Gaussian "
                 "fitted to the target draws between rounds, full-rank (variational) or "
                 "diagonal (variational-meanfield), annealed in a second leg joined to the "
                 "prior leg at the target",
    "figures": "with --out: write the figures (true/false)",
    "compile": "run the explorer step (rwmh, mala, hmc, and the stochastic-gradient "
               "explorers without control variates) as one torch.compile graph: faster "
               "iterations after a compilation of seconds; each step equals the plain one to "
               "rounding (a deterministic-rule run then diverges from the plain run after a "
               "flipped verdict: the same chain in law, not the same numbers); falls back to "
               "the plain step (true/false)",
    "fuse": "run the iterations in chunks (explore, swap, adapt, record) as one function, "
            "one torch.compile graph with --compile: fewer launches per iteration; true = "
            "chunks of 8, or a chunk length (16: faster, twice the compilation); one process, "
            "schemes deo/deo-w/seo; auto (default): eager chunks of 8 where they run, the "
            "same numbers as the plain loop (auto/true/false/N)",
    "swap_rule": "swap rule (default: metropolis for exact explorers, deterministic for "
                 "sgd/msgd/psgd, bias-corrected for sgld/sghmc/psgld)",
    "swap_rate": "target swap rate S in (0, 1) of the C and learning-rate adaptors; also sets "
                 "W = ceil((log P + log log P) / -log(1 - S)) for --window swap-rate",
    "lr_min": "learning rate of slot 0 (stochastic-gradient explorers)",
    "lr_max": "learning rate of slot P-1; the initial ladder is geometric in between",
    "learning_rates": "explicit initial learning-rate ladder, comma-separated, increasing",
    "noise_sd": "noisy oracle: sd of the Gaussian noise added to the energy (and gradient)",
    "grad_noise_sd": "noisy oracle: gradient noise sd if different from --noise-sd",
    "correction": "initial correction buffer C0 of the deterministic rule",
    "adapt": "deterministic rule: adapt C and the learning rates online (true/false)",
    "sa_step": "SA step sizes gamma_k = a / (k^kappa + b) as a,kappa,b (default 50,0.8,500)",
    "ladder_update": "how the learning rates adapt: paper (Eq. 11/12 as written; can collapse "
                     "two rungs) or log-gaps (Eq. 10 on the gaps of log eta, renormalized)",
    "bottom_temperature": "sgd/msgd/psgd: Langevin noise temperature at slot 0 (0: plain SGD)",
    "batch_size": "minibatch size (data targets); must not exceed the data",
    "vr_every": "variance-reduced energies: refresh the control-variate anchor every m "
                "iterations (0: off)",
    "variance_factor": "bias-corrected rule: divide the sigma^2 correction by F >= 1",
    "variance_every": "bias-corrected rule: refresh the per-slot sigma^2 every m iterations",
    "momentum": "momentum of sghmc / msgd (1 - friction)",
    "domain": "reflect stochastic-gradient steps onto box:LO,HI or ball:R",
}


def _typed(what: str, conv):
    """An argparse type whose error says what was expected (never an internal name)."""

    def parse(text: str):
        try:
            return conv(text)
        except (ValueError, TypeError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None

    parse.__name__ = what
    return parse


def _floats(text: str) -> list[float]:
    vals = [float(t) for t in text.split(",") if t.strip()]
    if not vals:
        raise ValueError(text)
    return vals


def _step(text: str):
    vals = _floats(text)
    return vals[0] if len(vals) == 1 else vals


def _burn_in(text: str):
    """An integer count ("500") or a fraction ("0.1")."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _window(text: str):
    return text if text in ("auto", "swap-rate") else int(text)


#: the words every boolean flag takes (case-insensitive)
BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
              "false": False, "no": False, "off": False, "0": False}


def _bool(text: str) -> bool:
    try:
        return BOOL_WORDS[text.strip().lower()]
    except KeyError:  # (_typed turns this into "argument --flag: expected ...")
        raise ValueError(text) from None


_INT = _typed("an integer", int)
_FLOAT = _typed("a number", float)
def _fuse(text: str) -> bool | int | str:
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low in BOOL_WORDS and low not in ("0", "1"):  # a number is a chunk length
        return BOOL_WORDS[low]
    return int(text)


_BOOL = _typed("true or false (true/false, yes/no, on/off, 1/0)", _bool)
_FLOATS = _typed("comma-separated numbers", _floats)
_TYPES = {
    "chains": _INT, "iterations": _INT, "leapfrog_steps": _INT, "n_explore": _INT,
    "systems": _INT, "seed": _INT, "thin": _INT, "window_tune": _INT, "checkpoint_every": _INT,
    "rounds": _INT, "batch_size": _INT, "vr_every": _INT, "variance_every": _INT,
    "max_temperature": _FLOAT, "target_acceptance": _FLOAT, "swap_rate": _FLOAT,
    "lr_min": _FLOAT, "lr_max": _FLOAT, "noise_sd": _FLOAT, "grad_noise_sd": _FLOAT,
    "correction": _FLOAT, "bottom_temperature": _FLOAT, "variance_factor": _FLOAT,
    "momentum": _FLOAT,
    "temperatures": _FLOATS, "betas": _FLOATS, "learning_rates": _FLOATS, "sa_step": _FLOATS,
    "step_size": _typed("a number or comma-separated numbers", _step),
    "window": _typed("an integer >= 1, auto or swap-rate", _window),
    "burn_in": _typed("a fraction in [0, 1) or an integer count", _burn_in),
    "adapt_schedule": _BOOL, "adapt_step_size": _BOOL, "figures": _BOOL,
    "compile": _BOOL, "adapt": _BOOL,
    "fuse": _typed("auto, true/false (yes/no, on/off) or a chunk length >= 1", _fuse),
}
_CHOICES = {"dtype": list(DTYPES), "slice_method": list(SLICE_METHODS),
            "ladder_update": ["paper", "log-gaps"],
            "reference": list(REFERENCES)}
for _role, _field in (("explorer", "explorer"), ("scheme", "scheme"), ("rule", "swap_rule")):
    _CHOICES[_field] = registry.names(_role)

PRESETS = ("deo-star-sgd", "none")


def _preset(args, data: dict) -> dict | None:
    """``nrpt run`` starts from the headline DEO*-SGD x P16 run (nrpt.run.sgpt.HEADLINE) unless a
    config file, --rounds, --target or an exact --explorer is given (or --preset none).  The
    preset's values are defaults: flags override them, and those that do not apply to the run
    the flags make are dropped (e.g. --window 1 is DEO-SGD x P16)."""
    preset = args.preset
    if preset is None:
        exact = args.explorer is not None and \
            "sg" not in registry.entry("explorer", args.explorer).tags
        own = args.config or args.rounds is not None or args.target or exact
        preset = "none" if own else "deo-star-sgd"
    if preset == "none":
        return None
    from nrpt.run.sgpt import HEADLINE

    base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HEADLINE.items()}
    if "target" in data and data["target"] != base["target"]:
        base.pop("target_options")  # the preset's options belong to its own target
    return base


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nrpt", description="Non-reversible parallel tempering.  `nrpt run` with no "
        "arguments runs the DEO*-SGD x P16 headline of Deng et al. (2023) on the 25-mode 2-D "
        "target; `nrpt list` shows every explorer, scheme, rule, adaptor and target.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run PT (default: the DEO*-SGD x P16 headline run)")
    run.add_argument("--config", help="TOML file (sections " + ", ".join(SECTIONS)
                     + "); flags override it")
    run.add_argument("--preset", choices=PRESETS, default=None,
                     help="starting configuration: deo-star-sgd (the paper's headline DEO*-SGD x "
                          "P16 run; the default without --config/--rounds/--target/exact "
                          "--explorer) or none (the RunConfig defaults: exact PT with rwmh)")
    groups = {sec: run.add_argument_group(f"[{sec}]") for sec in SECTIONS}
    home = {n: sec for sec, ns in SECTIONS.items() for n in ns}
    for f in fields(RunConfig):
        if f.name in ("target_options", "explicit"):
            continue
        flag = "--" + f.name.replace("_", "-")
        groups[home[f.name]].add_argument(
            flag, dest=f.name, default=None, type=_TYPES.get(f.name, str),
            choices=_CHOICES.get(f.name), help=_HELP.get(f.name))
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for the target factory (repeatable)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    threads_help = ("torch threads while sampling: an integer, or auto (default; also the "
                    "NRPT_THREADS environment variable): one thread for small states, where "
                    "torch's thread pool only slows tiny tensor ops")
    run.add_argument("--threads", default=None, metavar="N|auto", help=threads_help)
    run.add_argument("--nproc", type=_INT, default=None, metavar="N",
                     help="spread the replicas over N local processes (torch.distributed, "
                          "gloo; one GPU each with --device cuda); results are identical to "
                          "one process")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the run already in the --out folder (its run files are "
                          "removed first); without it such a folder is refused")
    res = sub.add_parser("resume", help="continue an interrupted run from its folder")
    res.add_argument("out")
    res.add_argument("--iterations", type=_INT, default=None,
                     help="extend a fixed-length run to this many iterations")
    res.add_argument("--target", default=None, metavar="PATH",
                     help="the run's target file (path/to/file.py or path/to/file.py:NAME) "
                          "when it is not at the path config.toml names; it must be the file "
                          "the run started with (sha256 in run.json)")
    res.add_argument("--no-progress", action="store_true")
    res.add_argument("--threads", default=None, metavar="N|auto", help=threads_help)
    res.add_argument("--nproc", type=_INT, default=None, metavar="N",
                     help="resume on N local processes (any N: checkpoints hold every replica)")
    from nrpt.deep.cli import add_parser as add_deep

    add_deep(sub)
    sub.add_parser("targets", help="list the built-in targets")
    ls = sub.add_parser("list", help="list the registered explorers, schemes, rules, adaptors "
                                     "and targets")
    ls.add_argument("role", nargs="?", choices=[*registry.ROLES, "targets", "explorers",
                                                "schemes", "rules", "adaptors"])
    return p


def _literal(key: str, text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _list(role: str | None) -> None:
    roles = registry.ROLES if role is None else [role.rstrip("s")]
    for r in roles:
        rows = registry.describe(r)
        print(f"{r}s:")
        width = max(len(n) for n, _ in rows)
        for name, summary in rows:
            e = registry.entry(r, name)
            tags = f" [{', '.join(sorted(e.tags))}]" if e.tags else ""
            print(f"  {name:<{width}}  {summary}{tags}")


def _interrupted(result, out, lead: bool = True) -> int:
    """Exit status 130 (and how to go on) for an interrupted run, 0 otherwise."""
    if result.summary.get("interrupted"):
        if lead:
            print(f"interrupted; continue with: nrpt resume {out}" if out else "interrupted")
        return 130
    return 0


def _launch(args, argv: list[str]) -> int | None:
    """``--nproc N`` outside a launched process group: start N ranks running the same command
    (without ``--nproc``) and return the exit status; ``None`` to run here."""
    n = getattr(args, "nproc", None)
    if n is None:
        return None
    if n < 1:
        raise ValueError(f"--nproc must be an integer >= 1; got {n}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if n != world:
            raise ValueError(f"--nproc {n} inside a launch of {world} processes")
        return None
    if n == 1:
        return None
    from nrpt.core import sharding as distributed

    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    return distributed.launch(n, rest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        return _main(args, argv)
    except KeyboardInterrupt:  # before a run installed its handler (or after it finished)
        print("nrpt: interrupted", file=sys.stderr)
        return 130


def _os_error(err: OSError, args) -> int:
    """An OS error of a run as one line naming the file, the cause and the remedy."""
    from nrpt.run.folder import os_error_message

    print(f"nrpt: error: {os_error_message(err, getattr(args, 'out', None))}", file=sys.stderr)
    return 1


def _main(args, argv: list[str]) -> int:
    from nrpt.run import api

    try:
        code = _launch(args, argv)
    except ValueError as err:
        print(f"nrpt: error: {err}", file=sys.stderr)
        return 2
    if code is not None:
        return code
    lead = int(os.environ.get("RANK", "0")) == 0

    try:
        if args.command == "targets":
            for name in registry.names("target"):
                print(name)
            return 0
        if args.command == "list":
            _list(args.role)
            return 0
        if args.command == "deep":
            from nrpt.deep.cli import run as run_deep

            return run_deep(args)
        if args.command == "resume":
            from nrpt.deep.cli import is_deep_run, resume_command

            if is_deep_run(args.out):  # a deep run folder: nrpt.deep resumes it
                return resume_command(args)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SamplingWarning)
                result = api.resume(args.out, progress=not args.no_progress and lead,
                                    iterations=args.iterations, threads=args.threads,
                                    target=args.target)
            if lead:
                print(result)
            return _interrupted(result, args.out, lead)
        data: dict = {}
        for f in fields(RunConfig):
            v = getattr(args, f.name, None)
            if v is not None:
                data[f.name] = v
        opts: dict = {}
        for item in args.option:
            if "=" not in item:
                raise ValueError(f"--option must be KEY=VALUE; got {item!r}")
            key, value = item.split("=", 1)
            opts[key] = _literal(key, value)
        if opts:
            data["target_options"] = opts
        defaults = _preset(args, data)
        if args.config:
            cfg = RunConfig.from_toml(args.config)
            merged = cfg.to_dict()
            if opts:
                data["target_options"] = {**merged["target_options"], **opts}
            cfg = cfg.replace(**data)
        else:
            cfg = RunConfig.from_dict(data, defaults=defaults)
        with warnings.catch_warnings():  # the report prints every finding itself
            warnings.simplefilter("ignore", SamplingWarning)
            result = api.run_config(cfg, progress=not args.no_progress and lead,
                                    overwrite=args.overwrite, threads=args.threads)
    except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError, RuntimeError) as err:
        if isinstance(err, OSError) and err.filename is not None and \
                not isinstance(err, FileNotFoundError):
            return _os_error(err, args)
        print(f"nrpt: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a read-only file system, a name too long, ...
        return _os_error(err, args)
    if lead:
        print(result)
    return _interrupted(result, cfg.out, lead)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
