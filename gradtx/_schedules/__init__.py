"""Schedules: small pytrees callable as `schedule(step)`, and stateful schedules."""
