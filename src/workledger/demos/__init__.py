"""Built-in demos, runnable with ``workledger demo NAME``.

``workledger.demos.events`` is also an ordinary app (``--app workledger.demos.events:ledger``):
the event fan-out of "Partial work needs a child ledger", with an idempotent ``apply`` stage
whose effects land in a separate SQLite sink so you can count what really happened.
"""
