"""Recorders: what a run measures (the recorder role), each in one home."""
