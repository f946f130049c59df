"""A small Django project on the test's database: SQLite or PostgreSQL, from the environment
tests/test_django.py sets (WL_DJANGO_*)."""

import os

SECRET_KEY = "workledger-tests-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["workledger.contrib.django", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
WORKLEDGER_APP = "wlsite.jobs:ledger"

if os.environ["WL_DJANGO_ENGINE"] == "sqlite":
    default = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["WL_DJANGO_NAME"]}
else:
    default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["WL_DJANGO_NAME"],
        "USER": os.environ["WL_DJANGO_USER"],
        "PASSWORD": os.environ["WL_DJANGO_PASSWORD"],  # never printed (the server trusts)
        "HOST": os.environ["WL_DJANGO_HOST"],
        "PORT": os.environ["WL_DJANGO_PORT"],
        "OPTIONS": {"options": os.environ["WL_DJANGO_OPTIONS"]},
    }
DATABASES = {
    "default": default,
    # another database: submitting through its connection is refused
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["WL_DJANGO_OTHER"]},
}
