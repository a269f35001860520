"""Every example of README.md runs as written: each ```python block as a script and each line
of each ```bash block in a shell, in a temporary folder that holds a copy of
``docs/examples`` (the README's commands run from the repository root).

Only the budget is cut, so that the suite stays fast; the rest of the text is the README's:

* textual substitution (:func:`cheap`): ``--iterations N`` / ``iterations=N`` become N // 250
  (at least 20; ratios between lines, such as a budget extension, are kept), ``--rounds N`` /
  ``rounds=N`` at most 4, ``--epochs N`` / ``epochs=N`` become 1;
* runs that state no budget get one from the harness, never from nrpt: the ``nrpt`` on the
  shell's PATH is a shim (``bin/nrpt``) that adds ``--iterations 200`` to an ``nrpt run``
  without ``--iterations``, ``--rounds`` or ``--config``, and the Python scripts start with a
  prelude that gives ``nrpt.sample`` the same default;
* the shim adds ``--figures false`` to every ``nrpt run`` of a test but the first (figures
  cost ~3 s a run and are tested elsewhere; the first run still writes its folder's figures).

The block ``make run`` / ``make test`` is not run (it builds a virtual environment and would run
this suite inside itself).  Lines that compile (``--compile true``: marker ``compile``),
start processes (``--nproc``: ``distributed``), compile a PyMC model or train on MNIST-1D
(``slow``) run with ``make test-all``;
the deep Python block is slow too (test_deep.py's fits are its fast representatives); the rest
costs about 30 s of CPU (the command-line block ~20 s: 11 processes, one of which writes
figures).  A failing line is
reported with its README line number and its output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT = 900


def blocks() -> list[tuple[str, int, str]]:
    """``(language, first line number, text)`` of each fenced block of the README."""
    found, lang, start, buf = [], None, 0, []
    for no, line in enumerate(README.read_text().splitlines(), 1):
        if lang is None:
            m = re.match(r"^```(\w+)\s*$", line)
            if m:
                lang, start, buf = m.group(1), no + 1, []
        elif line.startswith("```"):
            found.append((lang, start, "\n".join(buf) + "\n"))
            lang = None
        else:
            buf.append(line)
    return found


def commands(start: int, text: str) -> list[tuple[int, str]]:
    """The shell lines of a block (``\\`` continuations joined) with their README line."""
    out, pending, first = [], "", start
    for no, line in enumerate(text.splitlines(), start):
        if not pending:
            first = no
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full and not full.startswith("#"):
            out.append((first, full))
    return out


def _scaled(m: re.Match) -> str:
    return f"{m.group(1)}{max(20, int(m.group(2).replace('_', '')) // 250)}"


def cheap(text: str) -> str:
    """The README text with its budgets cut (the module docstring lists the substitutions)."""
    text = re.sub(r"(--iterations\s+|\biterations=)(\d[\d_]*)", _scaled, text)
    text = re.sub(r"(--rounds\s+|\brounds=)(\d+)",
                  lambda m: f"{m.group(1)}{min(4, int(m.group(2)))}", text)
    return re.sub(r"(--epochs\s+|\bepochs=)(\d+(?:\.\d*)?)", lambda m: f"{m.group(1)}1", text)


SHIM = '''#!{python}
import os, sys
sys.path.insert(0, {src!r})
args = sys.argv[1:]
if args[:1] == ["run"] and not {{"--iterations", "--rounds", "--config", "--help", "-h"}} & set(
        a.split("=")[0] for a in args):
    args += ["--iterations", "200"]  # the harness's budget for runs that state none
# figures cost ~3 s a run: the first `nrpt run` of a test writes them, later ones do not
_first = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".figures-written")
if args[:1] == ["run"] and "--figures" not in args:
    if os.path.exists(_first):
        args += ["--figures", "false"]
    else:
        open(_first, "w").close()
from nrpt.run.cli import main
sys.exit(main(args))
'''

PRELUDE = '''import functools, nrpt
_sample = nrpt.sample
@functools.wraps(_sample)
def _budgeted(*a, **k):  # the harness's budget for runs that state none (tests/test_readme.py)
    if "iterations" not in k and "rounds" not in k:
        k["iterations"] = 200
    return _sample(*a, **k)
nrpt.sample = _budgeted
'''


@pytest.fixture
def home(tmp_path):
    """A temporary 'repository root' with docs/examples and an ``nrpt`` shim on PATH."""
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    shim = bin_ / "nrpt"
    shim.write_text(SHIM.format(python=sys.executable, src=str(ROOT / "src")))
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return tmp_path, env


def _check(proc: subprocess.CompletedProcess, where: str) -> None:
    assert proc.returncode == 0, (f"README.md:{where} exits {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def run_shell(lines: list[tuple[int, str]], home) -> None:
    folder, env = home
    for no, line in lines:
        proc = subprocess.run(["bash", "-c", cheap(line)], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        _check(proc, f"{no}: {line}")


def run_python(start: int, text: str, home) -> None:
    folder, env = home
    script = folder / f"readme_{start}.py"
    script.write_text(PRELUDE + cheap(text))
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    _check(proc, f"{start} (python block)")


def _heavy(line: str) -> bool:
    return "--nproc" in line or "--compile true" in line


def _block(first_line: str) -> tuple[str, int, str]:
    for lang, start, text in blocks():
        if first_line in text.splitlines()[0]:
            return lang, start, text
    raise AssertionError(f"README.md has no block starting with {first_line!r}")


# ------------------------------------------------------------------ the README's blocks
def test_every_block_is_run_by_a_test():
    """A new block must get a test here (the first line of each names its block)."""
    firsts = [text.splitlines()[0] for _, _, text in blocks()]
    known = ("make run", "import nrpt", "import arviz", "nrpt run ", "import nrpt.deep",
             "nrpt deep ", "from nrpt.targets import from_stan")
    assert [f for f in firsts if not f.startswith(known)] == [], "give the new block a test"
    assert len(firsts) == 7, firsts


def test_the_budget_substitution():
    assert cheap("nrpt run --iterations 200000 --rounds 10") == "nrpt run --iterations 800 " \
                                                               "--rounds 4"
    assert cheap("iterations=20_000, rounds=3, epochs=30, pretrain_epochs=5") == \
        "iterations=80, rounds=3, epochs=1, pretrain_epochs=5"
    assert cheap("--iterations 50000 ... --iterations 100000") == \
        "--iterations 200 ... --iterations 400"


def test_python_block(home):
    _, start, text = _block("import nrpt")
    run_python(start, text, home)


def test_command_line_block(home):
    """The command-line lines in order (later lines use the folders earlier ones wrote),
    less the compiled and multi-process ones (tested below, slow)."""
    _, start, text = _block("nrpt run ")
    lines = [(no, line) for no, line in commands(start, text) if not _heavy(line)]
    assert any("my_model.py:TARGET" in line for _, line in lines)
    run_shell(lines, home)
    folder, _ = home
    assert (folder / "runs" / "mine" / "summary.json").exists()
    assert (folder / "runs" / "again" / "summary.json").exists()


def _run_marked_lines(home, marker: str, count: int) -> None:
    """The lines of the command-line block that contain ``marker`` (there are ``count``)."""
    _, start, text = _block("nrpt run ")
    lines = [(no, line) for no, line in commands(start, text) if marker in line]
    assert len(lines) == count
    run_shell(lines, home)


@pytest.mark.compile
def test_command_line_block_compiled_lines(home):
    _run_marked_lines(home, "--compile true", 2)


@pytest.mark.distributed
def test_command_line_block_multi_process_lines(home):
    _run_marked_lines(home, "--nproc", 2)


@pytest.mark.stan
def test_stan_block(home):
    """Compiles a Stan program (cached in $NRPT_STAN_CACHE / ~/.cache/nrpt/stan)."""
    pytest.importorskip("httpstan")
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build Stan models")
    _, start, text = _block("from nrpt.targets import from_stan")
    run_python(start, text, home)


@pytest.mark.slow
def test_pymc_block(home):
    pytest.importorskip("pymc")
    pytest.importorskip("arviz")
    _, start, text = _block("import arviz")
    run_python(start, text, home)


@pytest.mark.slow
def test_deep_python_block(home):
    """Slow (6 s): test_deep.py's fits on digits are the fast representatives."""
    pytest.importorskip("sklearn")
    _, start, text = _block("import nrpt.deep")
    run_python(start, text, home)


@pytest.mark.slow
def test_deep_command_line_block(home):
    """Slow: it generates MNIST-1D and trains for the digits/mnist1d default of 5 pretraining
    epochs plus one (14 s of CPU); test_deep.py's CLI test is the fast representative."""
    pytest.importorskip("mnist1d")
    _, start, text = _block("nrpt deep ")
    run_shell(commands(start, text), home)
