"""Layer 5, schedules: small pytrees callable as `schedule(step)`, and stateful schedules."""
