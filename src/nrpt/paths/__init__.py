"""Paths: the family of distributions over slots (ladders, the variational reference)."""
