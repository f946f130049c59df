"""The HTTP surface: a JSON API, a dashboard and Prometheus metrics over the ``Ledger`` facade.

Needs the ``web`` extra (``pip install 'workledger[web]'``): FastAPI, uvicorn, Jinja2 and
prometheus-client. Like the CLI, it reaches the ledger only through ``workledger.api``.
"""

from workledger.http.app import create_app
from workledger.http.auth import Tokens, load_tokens

__all__ = ["Tokens", "create_app", "load_tokens"]
