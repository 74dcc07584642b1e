"""The settings of a test run: the platform's own, read after :mod:`tests.isolation` gave this
pytest-xdist worker its own Redis databases and var directory (pytest-django imports this module,
``--ds`` in pyproject.toml, before any test code, so nothing has read the environment yet)."""

import importlib
import os

from tests.isolation import isolate

isolate()  # before portal.settings reads the environment (an import sorter must not reorder it)
globals().update(
    {k: v for k, v in vars(importlib.import_module("portal.settings")).items() if k.isupper()}
)

# The processes the tests start (workers, gateways, ./dev) read the platform's own settings
# module, from the environment this worker was given.
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
