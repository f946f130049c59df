"""Putting the ledger right after the fact: the sweeper, retention, audits, reconciliation and
the operator's actions."""
