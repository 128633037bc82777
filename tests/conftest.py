"""Test session settings: Ray binds to loopback only; torch architecture exports are kept on disk in a directory
of this session (never the user's cache), shared by every process the tests start."""

import os
import tempfile

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["KEEPER_ARCH_CACHE"] = tempfile.mkdtemp(prefix="keeper-arch-cache-")
