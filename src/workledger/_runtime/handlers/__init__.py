"""Running handlers: one call and its outcome, and the executors they run in (threads, an event
loop, child processes)."""
