"""Shared pytest fixtures."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The project key and ledger anchors go to a throw-away config dir, never the user's ~/.config.
os.environ.pop("FORGETFUL_LEDGER_KEY", None)
os.environ.pop("FORGETFUL_KEY_FILE", None)
os.environ.pop("FORGETFUL_LEDGER_DIR", None)
os.environ["FORGETFUL_CONFIG_DIR"] = tempfile.mkdtemp(prefix="forgetful-test-config-")
# ... and it goes when the session ends (it holds the session's keys and registry index)
atexit.register(shutil.rmtree, os.environ["FORGETFUL_CONFIG_DIR"], ignore_errors=True)
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture(autouse=True)
def _fresh_registry_index():
    """Every test starts as its own configuration for the forget registries: the index of
    registries by source (``<config>/registries.json``, :mod:`pipelines.store.registries`) is
    emptied, so one test's forgets never reach another test's builds of the same source (the
    keys stay the session's)."""
    from pipelines.store.registries import index_path

    index_path().unlink(missing_ok=True)
    yield


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole test session (cold start is 12-22 s)."""
    from prefect.settings import temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from pipelines.runtime.runner import heartbeat_settings

    # the harness is a throw-away server, as a command's private one: no flow-run heartbeats
    # (each flow call would otherwise end on the next whole second: pipelines.runtime.runner.heartbeat_settings)
    with prefect_test_harness(server_startup_timeout=180), temporary_settings(heartbeat_settings(shared=False)):
        yield
