"""Adapters from probabilistic programming languages to nrpt targets."""
