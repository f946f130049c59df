"""Integrations with other frameworks, each an extra (``pip install 'workledger[django]'``).

Nothing outside this package imports it, and the core never imports the packages it
integrates with: a user imports ``workledger.contrib.<name>`` (tests/test_layers.py).
"""
