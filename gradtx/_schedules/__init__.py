"""Schedules: small pytrees callable as `schedule(step)`."""
