"""The runtime: job definitions, decomposition, the worker. Talks to storage through the port."""
