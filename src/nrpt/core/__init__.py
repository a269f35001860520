"""The machine: the engine state and its step, the run loop, the fused chunk, sharding."""
