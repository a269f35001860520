"""Compiling a Stan program into nrpt's bridge extension, with an on-disk cache.

The toolchain is httpstan's wheel (``pip install nrpt[stan]``): its ``stanc`` binary turns the
program into C++, its ``include/`` holds Stan, Stan Math, Eigen, Boost, SUNDIALS and pybind11,
its ``lib/`` libtbb; the system C++ compiler (``g++``, or ``$CXX``) builds two objects:

* ``bridge-<key>.o``: :file:`bridge.cpp` (the batched log density, gradient, constrained
  values and Stan's NUTS through ``stan::model::model_base``), independent of the program,
  compiled once per (bridge source, httpstan version, compiler, flags);
* the program's own object (the stanc output), linked with the bridge into
  ``<cache>/<key>/_nrpt_stan_bridge<ext>``, keyed by (program text, model name, httpstan
  version, compiler, flags, bridge key).

The cache is ``$NRPT_STAN_CACHE`` or ``~/.cache/nrpt/stan``.  Each entry is built in a
temporary directory beside it and renamed into place, under a lock file, so two processes
compiling the same program build it once and never see half an entry."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from nrpt.targets.protocol import TargetError

__all__ = ["StanCompileError", "OPT_LEVEL", "cache_dir", "compile_model", "load_module",
           "stanc", "toolchain"]

#: the optimization level of both objects: -O1 compiles a small program ~1.4x faster than
#: -O2 but its gradients run slower (docs: README "Stan models"; measured in
#: tests/test_stan.py's module docstring)
OPT_LEVEL = "-O2"

#: httpstan's preprocessor macros (its models.py), the ABI of its manylinux libtbb included
_MACROS = ("-DBOOST_DISABLE_ASSERTS", "-DBOOST_PHOENIX_NO_VARIADIC_EXPRESSION",
           "-DSTAN_THREADS", "-D_REENTRANT", "-D_GLIBCXX_USE_CXX11_ABI=0")
_WARNINGS = ("-Wno-sign-compare", "-Wno-ignored-attributes", "-Wno-deprecated-declarations",
             "-Wno-unused-but-set-variable", "-Wno-unused-variable")
_LIBS = ("sundials_cvodes", "sundials_idas", "sundials_kinsol", "sundials_nvecserial", "tbb")

_BRIDGE = Path(__file__).with_name("bridge.cpp")
MODULE = "_nrpt_stan_bridge"
_INSTALL = "pip install 'nrpt[stan]'  (installs httpstan>=4.13, which ships Stan and stanc)"


class StanCompileError(TargetError):
    """A Stan program that stanc or the C++ compiler refused (the message is theirs), or a
    missing toolchain (httpstan, a C++ compiler)."""


def cache_dir() -> Path:
    """``$NRPT_STAN_CACHE`` or ``~/.cache/nrpt/stan``."""
    env = os.environ.get("NRPT_STAN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nrpt" / "stan"


def _httpstan() -> tuple[Path, str]:
    """httpstan's package directory (found without importing it) and its version."""
    spec = importlib.util.find_spec("httpstan")
    if spec is None or not spec.submodule_search_locations:
        raise StanCompileError(f"Stan programs need httpstan, which is not installed: {_INSTALL}")
    root = Path(next(iter(spec.submodule_search_locations)))
    for part in ("stanc", "include/stan", "lib"):
        if not (root / part).exists():
            raise StanCompileError(f"httpstan at {root} has no {part}: reinstall it ({_INSTALL})")
    return root, importlib.metadata.version("httpstan")


def _compiler() -> tuple[str, str]:
    """``(path of the C++ compiler, its version line)``: ``$CXX`` or ``g++``."""
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise StanCompileError(
            f"Stan programs are compiled to C++ and need a C++ compiler, and {name!r} was not "
            f"found on PATH: install g++ (Debian/Ubuntu: apt-get install g++; macOS: "
            f"xcode-select --install) or set CXX to a C++17 compiler")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return path, (out.stdout.splitlines() or [name])[0].strip()


def toolchain() -> dict[str, str]:
    """What a compiled model depends on: httpstan's directory and version, the compiler and
    its version, the flags; raises :class:`StanCompileError` where a piece is missing."""
    root, version = _httpstan()
    cxx, cxx_version = _compiler()
    return {"httpstan": str(root), "httpstan_version": version, "cxx": cxx,
            "cxx_version": cxx_version, "flags": " ".join(_flags(root))}


def _flags(root: Path) -> list[str]:
    py_include = sysconfig.get_paths()["include"]
    return [OPT_LEVEL, "-std=c++17", "-fPIC", "-fvisibility=hidden", *_MACROS, *_WARNINGS,
            f"-I{root / 'include'}", f"-I{py_include}"]


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def model_name(name: str | None) -> str:
    """A C++ identifier for stanc's ``--name`` from a file stem (or ``"model"``)."""
    base = re.sub(r"\W", "_", name or "stan")
    if not base or base[0].isdigit():
        base = "m_" + base
    return base if base.endswith("_model") else base + "_model"


def stanc(program: str, name: str) -> tuple[str, str]:
    """``(C++ code, stanc's warnings)`` of ``program``; :class:`StanCompileError` with stanc's
    message where it refuses the program."""
    root, _ = _httpstan()
    with tempfile.TemporaryDirectory(prefix="nrpt-stanc-") as tmp:
        src = Path(tmp) / f"{name}.stan"
        src.write_text(program)
        proc = subprocess.run([str(root / "stanc"), "--name", name, "--warn-pedantic",
                               "--print-cpp", str(src)], capture_output=True, text=True,
                              timeout=120, check=False)
    err = proc.stderr.strip().replace(str(src), f"{name}.stan")
    if proc.returncode != 0:
        raise StanCompileError(f"stanc rejected the Stan program:\n{err}")
    return proc.stdout, err


def _run(cmd: list[str], what: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
        shown = "\n".join(lines[:20]) or proc.stderr[-4000:]
        raise StanCompileError(f"the C++ compiler failed on {what} ({Path(cmd[0]).name}, exit "
                               f"{proc.returncode}):\n{shown}")
    return time.perf_counter() - t0


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created), held for the block (POSIX ``flock``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover -- not POSIX: no lock, the rename stays atomic
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _bridge_object(tc: dict[str, str], cache: Path) -> tuple[Path, str, float]:
    """``(path, key, seconds spent compiling)`` of the program-independent bridge object."""
    src = _BRIDGE.read_text()
    key = _hash("bridge", src, tc["httpstan_version"], tc["cxx_version"], tc["flags"])[:20]
    obj = cache / f"bridge-{key}.o"
    if obj.is_file():
        return obj, key, 0.0
    with _locked(cache / f"bridge-{key}.lock"):
        if obj.is_file():
            return obj, key, 0.0
        with tempfile.TemporaryDirectory(prefix="bridge-", dir=cache) as tmp:
            out = Path(tmp) / "bridge.o"
            secs = _run([tc["cxx"], *tc["flags"].split(), "-c", str(_BRIDGE), "-o", str(out)],
                        "nrpt's Stan bridge (bridge.cpp)", Path(tmp))
            os.replace(out, obj)
    return obj, key, secs


def compile_model(program: str, name: str | None = None) -> tuple[Path, dict]:
    """The cached extension for ``program`` (compiled on a miss) and a record:
    ``{"key", "name", "cached", "seconds", "stanc_warnings", ...}``."""
    t0 = time.perf_counter()
    tc = toolchain()
    name = model_name(name)
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    bridge, bridge_key, bridge_secs = _bridge_object(tc, cache)
    key = _hash("model", program, name, tc["httpstan_version"], tc["cxx_version"], tc["flags"],
                bridge_key)[:24]
    entry = cache / key
    so = entry / (MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    info = {"key": key, "name": name, "dir": str(entry), **tc}
    if so.is_file():
        return so, {**_read_info(entry), **info, "cached": True,
                    "seconds": time.perf_counter() - t0}
    with _locked(cache / f"{key}.lock"):
        if so.is_file():  # another process built it while this one waited
            return so, {**_read_info(entry), **info, "cached": True,
                        "seconds": time.perf_counter() - t0}
        cpp, warnings = stanc(program, name)  # before the compiler: Stan's own message first
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=cache))
        try:
            (tmp / "model.stan").write_text(program)
            (tmp / "model.hpp").write_text(cpp)
            secs_model = _run([tc["cxx"], *tc["flags"].split(), "-x", "c++", "-c", "model.hpp",
                               "-o", "model.o"], "the stanc output of the program", tmp)
            lib = Path(tc["httpstan"]) / "lib"
            _run([tc["cxx"], "-shared", "-o", so.name, "model.o", str(bridge), f"-L{lib}",
                  *(f"-l{x}" for x in _LIBS), f"-Wl,-rpath,{lib}"], "linking the model", tmp)
            (tmp / "model.o").unlink()
            record = {"stanc_warnings": warnings, "compile_seconds": secs_model,
                      "bridge_seconds": bridge_secs, "created": time.time()}
            (tmp / "info.json").write_text(json.dumps(record))
            if entry.exists():  # a damaged entry (no extension): replaced
                shutil.rmtree(entry)
            os.replace(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return so, {**record, **info, "cached": False, "seconds": time.perf_counter() - t0}


def _read_info(entry: Path) -> dict:
    try:
        return json.loads((entry / "info.json").read_text())
    except (OSError, ValueError):
        return {}


def load_module(so: Path):
    """The extension module at ``so`` (each model's file is its own module object)."""
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(so))
    spec = importlib.util.spec_from_file_location(MODULE, str(so), loader=loader)
    if spec is None:  # pragma: no cover
        raise StanCompileError(f"cannot load the compiled Stan model {so}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _main() -> None:  # pragma: no cover -- `python -m nrpt.targets.stan.build FILE.stan`
    path = Path(sys.argv[1])
    so, info = compile_model(path.read_text(), path.stem)
    print(so, json.dumps({k: v for k, v in info.items() if k != "flags"}, indent=1))


if __name__ == "__main__":  # pragma: no cover
    _main()
