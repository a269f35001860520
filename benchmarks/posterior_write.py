"""How long the default ``nrpt run`` spends writing ``posterior.nc``.

Runs ``nrpt run --out OUT --overwrite`` (the default target and settings) in this fresh
process with :func:`nrpt.report.text.export_inference_data` wrapped in a timer, so the figure
includes every import the writer triggers (ArviZ's, when it was used).  Prints one line::

    python benchmarks/posterior_write.py /tmp/x
"""

import sys
import time

import nrpt.report.text as report
from nrpt.run.cli import main


def run(out: str) -> None:
    write, spent = report.export_inference_data, []

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return write(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    report.export_inference_data = timed
    t0 = time.perf_counter()
    main(["run", "--out", out, "--overwrite"])
    total = time.perf_counter() - t0
    print(f"posterior.nc written in {spent[0]:.3f} s of a {total:.2f} s run; ArviZ imported: "
          f"{'arviz' in sys.modules}", file=sys.stderr)


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "/tmp/nrpt-posterior-write")
