"""Layer 3, the core: modules, the protocol and its outermost call, lifting, `apply_updates`."""
