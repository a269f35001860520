"""Reports of a run: summary, health checks, text, figures, the posterior file."""
