"""An app module that fails while importing."""

raise RuntimeError("the app's configuration is missing")
