"""The worker: its claim loop, its lanes, one claimed chunk at a time, and what it holds."""
