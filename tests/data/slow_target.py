"""A 2-D Gaussian whose energy takes at least 3 ms per call (``time.sleep``), so a test can
interrupt a run in its middle whatever the machine's speed."""

import time


class SlowGaussian:
    name = "slow-gaussian"
    dim = 2

    def energy(self, x):
        time.sleep(0.003)
        return 0.5 * (x * x).sum(-1)


TARGET = SlowGaussian()
