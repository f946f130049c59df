"""Integrations with the tools a team already runs, each an extra and imported only by you.

- ``workledger.contrib.celery`` (``pip install 'workledger[celery]'``): dispatch through
  Celery (docs/celery.md);
- ``workledger.contrib.rq`` (``pip install 'workledger[rq]'``): dispatch through RQ
  (docs/rq.md).

Nothing in workledger outside this package imports it, and it imports only the public API and
the runtime it needs (tests/test_layers.py).
"""
