"""Concurrency tests: real worker processes, kills, stops and races (both backends)."""
