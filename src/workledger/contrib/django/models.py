"""No models: the ledger's tables are workledger's own (migrated by ``manage.py migrate``
through the ledger, see ``apps.py``). The module exists because Django sends ``post_migrate``
only to apps that have one."""
