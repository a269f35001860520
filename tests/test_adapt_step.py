"""Between-round step-size tuning (nrpt.adapt.step)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from nrpt.adapt import ACCEPTANCE_ORDER, step_size_factor


@pytest.mark.parametrize("explorer", sorted(ACCEPTANCE_ORDER))
def test_one_step_lands_on_the_target_when_the_model_holds(explorer):
    # acceptance a(h) = 2 Phi(-c h^k / 2): the update solves for c and inverts exactly
    k, c, target = ACCEPTANCE_ORDER[explorer], 0.8, 0.6
    a = lambda h: 2 * ndtr(-c * h**k / 2)  # noqa: E731
    h = np.array([0.8, 1.1, 1.4])  # acceptances inside the unclipped range [0.01, 0.99]
    h_new = h * step_size_factor(a(h), target, k)
    np.testing.assert_allclose(a(h_new), target, rtol=1e-10)


def test_factor_is_clipped_and_missing_data_leaves_the_step_alone():
    f = step_size_factor([0.0, 1.0, np.nan, 0.5], 0.5, 1)
    assert f[0] < 1
    assert f[1] > 1 and f[2] == 1.0 and f[3] == pytest.approx(1.0)
    assert np.all((f >= 0.25) & (f <= 4.0))
    with pytest.raises(ValueError, match="target acceptance must be in"):
        step_size_factor([0.5], 1.0, 1)
    with pytest.raises(ValueError, match="order must be an integer"):
        step_size_factor([0.5], 0.5, 0)
