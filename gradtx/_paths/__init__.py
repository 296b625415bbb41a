"""Layer 1, paths: naming leaves by path, selecting them, restricted views, bounded caches."""
