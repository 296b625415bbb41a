"""Layer 2, the core: immutable modules, the protocol, the lifting helper, `apply_updates`."""
