"""Command line: ``nrpt run`` (flags or a TOML config), ``nrpt resume DIR``, ``nrpt figures
DIR``, ``nrpt list``.
Flags mirror :class:`nrpt.run.config.RunConfig` (and override ``--config FILE``).  Exit
status: 0 done, 2 a user error (``nrpt: error: ...``), 130 interrupted (checkpointed)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from nrpt.options import Option, add_flags, parse_int, typed
from nrpt.report.health import SamplingWarning
from nrpt.run import registry
from nrpt.run.config import COMPONENTS, RunConfig, declarations, known_options, section_table

_INT = typed("an integer", parse_int)


def _add_settings(run: argparse.ArgumentParser) -> None:
    """One flag per declared setting, in one ``--help`` group per section and component."""
    def title(opt: Option, role: str | None, names: list[str]) -> str:
        if role is None:
            return f"[{opt.section}]"
        field = COMPONENTS[role]
        return f"[{opt.section}] " + (f"{field} {names[0]}" if len(names) == 1 else
                                      f"{field}s {', '.join(names)}")

    add_flags(run, ((o, title(o, role, names)) for o, role, names in declarations()))


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
    run.add_argument("--config", help="TOML file (sections " + ", ".join(section_table())
                     + "); flags override it")
    run.add_argument("--preset", choices=PRESETS, default=None,
                     help="starting configuration: deo-star-sgd (the paper's headline DEO*-SGD x "
                          "P16 run; the default without --config/--rounds/--target/exact "
                          "--explorer) or none (the RunConfig defaults: exact PT with rwmh)")
    _add_settings(run)
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for the target factory (repeatable)")
    run.add_argument("--data", default=None, metavar="PATH",
                     help="the data of a Stan program target (--target model.stan): a JSON "
                          "file (the same as --option data=PATH)")
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
    fig = sub.add_parser("figures", help="draw the figures of a finished run from its folder "
                                         "(a run draws none unless --figures true/all)")
    fig.add_argument("out")
    fig.add_argument("--all", action="store_true",
                     help="also the trace and rank plots and the index process's zoom "
                          "(what --figures all draws)")
    fig.add_argument("--target", default=None, metavar="PATH",
                     help="the run's target file when it is not at the path config.toml names "
                          "(as for resume)")
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
            opts = f" (options: {', '.join(e.options)})" if r in COMPONENTS and e.options \
                else ""
            print(f"  {name:<{width}}  {summary}{tags}{opts}")


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
    from nrpt.deep.cli import check_launch, is_deep_run

    if args.command == "deep" or (args.command == "resume" and is_deep_run(args.out)):
        check_launch(args, n)  # (a deep run that cannot be spread: said before any launch)
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


def entry() -> int:
    """The program ``nrpt`` (``python -m nrpt`` and the console script): :func:`main` on
    ``sys.argv``, in a process that ends with it, whose heap is treated as such.  The objects
    the imports made (torch's modules, functions and tables: a few hundred thousand, alive until
    exit) are frozen out of the cyclic collector's passes (``gc.freeze``), as are the run's own
    objects when its outputs are written (:func:`nrpt.run.api._heap_frozen`), and the whole heap
    again at exit, before the interpreter's last passes, which otherwise walk it all (~0.3 s
    CPU of a headline run; docs/benchmarks.md, stop 38 lane proc2).  The objects are still freed
    as their references go; only cycles among frozen ones wait for the exit, where memory is
    handed back whole (no run output depends on a finalizer: each file is closed where it is
    written)."""
    import atexit
    import gc

    from nrpt.run import api

    api._PROGRAM = True
    if gc.isenabled():
        gc.freeze()
        atexit.register(gc.freeze)  # (run before the handlers registered earlier: torch's)
    return main()


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


#: errors a user can fix, printed as one line with exit status 2 (an OSError naming a file that
#: exists, or any other OSError -- a full disk, a read-only file system -- goes to _os_error)
_USER_ERRORS = (ValueError, RuntimeError, FileNotFoundError, NotADirectoryError,
                IsADirectoryError, PermissionError)


def _failed(err: Exception, args) -> int:
    if isinstance(err, OSError) and (not isinstance(err, _USER_ERRORS) or (
            err.filename is not None and not isinstance(err, FileNotFoundError))):
        return _os_error(err, args)
    print(f"nrpt: error: {err}", file=sys.stderr)
    return 2


def _config(args) -> RunConfig:
    """``nrpt run``'s configuration: the flags over ``--config FILE``, or over the preset."""
    data: dict = {}
    for name in known_options():
        v = getattr(args, name, None)
        if v is not None:
            data[name] = v
    opts: dict = {}
    for item in args.option:
        if "=" not in item:
            raise ValueError(f"--option must be KEY=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        opts[key] = _literal(key, value)
    if args.data is not None:
        opts["data"] = args.data  # a path: never parsed as a number
    if opts:
        data["target_options"] = opts
    if not args.config:
        _stan_defaults(data)
        return RunConfig.from_dict(data, defaults=_preset(args, data))
    cfg = RunConfig.from_toml(args.config)
    if opts:
        data["target_options"] = {**cfg.target_options, **opts}
    # a .stan target's defaults join the file's settings and the flags as they join the flags
    # alone: what the file or a flag sets stays (the file's unset settings are not explicit)
    given = {k: v for k, v in cfg.to_dict().items() if k in cfg.explicit} | data
    joined = dict(given)
    _stan_defaults(joined)
    data.update({k: v for k, v in joined.items() if k not in given})
    return cfg.replace(**data)


def _stan_defaults(data: dict) -> None:
    """A ``.stan`` target's ``default_settings`` for an adaptive run, as ``nrpt.sample`` takes
    them from the target object (:func:`nrpt.run.api.apply_target_defaults`: a named explorer
    replaces the default one only)."""
    target = str(data.get("target") or "")
    if not target.endswith(".stan") or data.get("rounds") is None:
        return
    from nrpt.run.api import apply_target_defaults
    from nrpt.targets.stan import StanTarget  # (no compiling: the class only)

    apply_target_defaults(dict(StanTarget.default_settings), data, f"target {target!r}")


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
        if args.command == "figures":
            names = api.figures(args.out, which="all" if args.all else True,
                                target=args.target)
            print(f"{len(names)} figure{'s' if len(names) != 1 else ''} in {args.out}: "
                  f"{', '.join(names) or 'none (the run has no iterations)'}")
            return 0
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
        cfg = _config(args)
        with warnings.catch_warnings():  # the report prints every finding itself
            warnings.simplefilter("ignore", SamplingWarning)
            result = api.run_config(cfg, progress=not args.no_progress and lead,
                                    overwrite=args.overwrite, threads=args.threads)
    except (ValueError, RuntimeError, OSError) as err:
        return _failed(err, args)
    if lead:
        print(result)
    return _interrupted(result, cfg.out, lead)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
