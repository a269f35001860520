"""``window = "auto"``: W* of DEO_W from the rejection rate measured in a tuning segment.

The tuning segment (``"tune"``, ``window_tune`` iterations of DEO) gives the mean adjacent
rejection rate ``r``; ``W* = ceil((log P + log log P) / -log r)`` (Deng et al. 2023, Lemma 1;
:func:`nrpt.diagnostics.theory.optimal_window`), then the scheme switches to DEO_W(W*).
"""

from __future__ import annotations

from nrpt.diagnostics import theory
from nrpt.roles import AdaptorBase, SegmentView, Update

__all__ = ["WindowAdaptor"]


class WindowAdaptor(AdaptorBase):
    name = "window"

    def __init__(self, chains: int):
        self.P = int(chains)
        self.window: int | None = None
        self.rejection: float | None = None

    def end_segment(self, view: SegmentView) -> Update | None:
        if self.window is not None or view.last or view.name != "tune":
            return None
        rej = view.recorders["swaps"].rejection().nan_to_num(nan=0.0).mean()
        self.rejection = float(rej.clamp(0.0, 1.0 - 1e-9))
        self.window = theory.optimal_window(self.P, self.rejection)
        return Update(window=self.window,
                      note={"window": self.window, "window_rejection": self.rejection})

    def state_dict(self) -> dict:
        return {"window": self.window, "rejection": self.rejection}

    def load_state_dict(self, sd: dict) -> None:
        self.window, self.rejection = sd["window"], sd["rejection"]
