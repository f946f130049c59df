"""The runtime, private: decomposition, the handlers, the worker, the broker, the repairs. Job
definitions are public (``workledger.jobs``). Talks to storage through the port."""
