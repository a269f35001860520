"""Running: configuration, registry, build, the Python API, the command line, run folders."""
