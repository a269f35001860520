"""Deep posteriors: P network replicas tempered as one batched model (see docs/deep.md)."""
