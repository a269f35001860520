"""The fixed cost of a process that samples (issue 24, lane start): ``import nrpt`` and a run
without an output folder leave the modules they do not use unloaded -- the test kit
(:mod:`nrpt.testing`, reachable as ``nrpt.testing`` on first use), the posterior-file writer
(:mod:`nrpt.report.posterior_file`) and the Gaussian / variational reference paths.  Each check
runs in a fresh interpreter; the negative control (a run with ``out``) loads the writer."""

import ast
import subprocess
import sys

UNUSED = ("nrpt.testing", "nrpt.report.posterior_file", "nrpt.paths.gaussian_reference",
          "nrpt.paths.variational")


def _loaded_after(code: str, *args: str) -> list[str]:
    probe = f"{code}; print([m for m in {UNUSED!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", "import sys, nrpt; " + probe, *args],
                          capture_output=True, text=True, check=True)
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])  # the names printed above


def test_import_and_a_run_without_out_leave_unused_modules_unloaded(tmp_path):
    assert _loaded_after("pass") == []
    run = ("nrpt.sample('twenty-five-modes', iterations=64, chains=4, figures=False, "
           "explorer='rwmh', seed=1{})")
    assert _loaded_after(run.format("")) == []
    # the negative control: a run folder writes posterior.nc through the writer
    assert "nrpt.report.posterior_file" in _loaded_after(run.format(", out=sys.argv[1]"),
                                                         str(tmp_path / "run"))


def test_testing_stays_reachable_as_an_attribute():
    code = ("import sys, nrpt; assert 'nrpt.testing' not in sys.modules; "
            "t = nrpt.testing; assert t is sys.modules['nrpt.testing']; "
            "assert callable(t.assert_invariant) and 'testing' in nrpt.__all__; "
            "from nrpt import testing; assert testing is t\n"
            "try:\n    nrpt.no_such_name\nexcept AttributeError as err:\n"
            "    assert 'no_such_name' in str(err)\nelse:\n    raise SystemExit(1)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_gaussian_reference_names_are_one_tuple():
    """run checks and build read the Gaussian references' names from :mod:`nrpt.paths` (so
    they need not import the module); the module's own name is that tuple, not a copy."""
    from nrpt import paths
    from nrpt.paths.gaussian_reference import GAUSSIAN
    from nrpt.run import build, config

    assert GAUSSIAN is paths.GAUSSIAN_REFERENCES is config.GAUSSIAN_REFERENCES is build.GAUSSIAN
