"""Test session settings: Ray binds to loopback only."""

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("KEEPER_QUIET_EXPORT", "1")
