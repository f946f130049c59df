"""Integrations with the tools a team already runs, each an extra and imported only by you.

- ``workledger.contrib.celery`` (``pip install 'workledger[celery]'``): dispatch through
  Celery (docs/celery.md);
- ``workledger.contrib.rq`` (``pip install 'workledger[rq]'``): dispatch through RQ
  (docs/rq.md);
- ``workledger.contrib.django`` (``pip install 'workledger[django]'``): the Django app
  (docs/django.md).

Nothing outside this package imports it, and the core never imports the packages it
integrates with: a user imports ``workledger.contrib.<name>`` (tests/test_layers.py).
"""
