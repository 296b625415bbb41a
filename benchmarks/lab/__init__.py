"""One-off investigations, GPU run scripts and the measurement history (see README.md)."""
