"""Run a document's examples as a reader would: each block marked ``<!-- readme-test: NAME -->`` (README.md) or
``<!-- doc-test: NAME -->`` (docs/) in a fresh process, with the zoo in ``$KEEPER_ZOO`` and ``$HOME`` in the test's
temporary directory, on a 2-CPU Ray on loopback that the examples of one test module share (:class:`SharedRay`):
the Python blocks start no Ray of their own (keeper and Tune connect to the one running), so the test prepends the
connection; the keeper service an example leaves is stopped before the next one, so every example starts its own
over its own zoo, as on a reader's machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
MARKER = re.compile(r"<!-- (?:readme|doc)-test: ([\w-]+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
FENCE = re.compile(r"```(\w+)\n(.*?)\n```", re.S)


def blocks(doc: Path = README) -> dict[str, tuple[str, str]]:
    """``{name: (language, code)}`` of the marked blocks of ``doc``."""
    return {m.group(1): (m.group(2), m.group(3)) for m in MARKER.finditer(doc.read_text())}


class SharedRay:
    """A local Ray of 2 CPUs on loopback, started in the test process, that examples join as drivers of their own.

    Its workers take the test process's environment, so an example's driver passes what its workers must see (the
    zoo) as its job's ``runtime_env``; an example's ``$HOME`` is its own, so it finds the cluster's authentication
    token through ``RAY_AUTH_TOKEN_PATH``.
    """

    def __init__(self) -> None:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # its own, whatever runs
        self.address = ray.get_runtime_context().gcs_address
        self.token = Path(os.path.expanduser("~")) / ".ray" / "auth_token"

    def prelude(self, zoo: Path) -> str:
        """The lines an example's Python runs first: joining this Ray, its workers seeing the example's zoo."""
        return (f"import ray\nray.init(address={self.address!r}, log_to_driver=False, "
                f"runtime_env={{'env_vars': {{'KEEPER_ZOO': {str(zoo)!r}}}}})\n")

    def env(self) -> dict[str, str]:
        """What an example's process needs beside the prelude to join: where the cluster's token is."""
        return {"RAY_AUTH_TOKEN_PATH": str(self.token)} if self.token.exists() else {}

    def stop_services(self) -> None:
        """Stop the keeper service an example left running (its detached actors outlive the example's driver)."""
        import keeper.actors as ka

        ka.shutdown()

    def shutdown(self) -> None:
        import ray

        ray.shutdown()


def example_env(tmp_path: Path, home: bool = True, **extra: str) -> dict[str, str]:
    """The example's environment: the zoo in ``$KEEPER_ZOO``, and (``home``) ``$HOME`` in ``tmp_path`` so Tune's
    default results directory lands there. A shell joining the test's Ray keeps the test's ``$HOME``, where Ray
    keeps the cluster's authentication token."""
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**os.environ, "KEEPER_ZOO": str(tmp_path / "zoo"),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if home:
        env["HOME"] = str(tmp_path / "home")
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def run_python(name: str, tmp_path: Path, ray: SharedRay | None = None, doc: Path = README) -> str:
    """Run ``doc``'s Python block ``name`` in a fresh process (joining ``ray`` when given); its stdout."""
    lang, code = blocks(doc)[name]
    assert lang == "python", f"{doc.name} block {name!r} is {lang}, expected python"
    script = tmp_path / f"readme_{name}.py"
    script.write_text((ray.prelude(tmp_path / "zoo") if ray else "") + code + "\n")
    env = example_env(tmp_path, **(ray.env() if ray else {}))
    try:
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        if ray:
            ray.stop_services()
    assert out.returncode == 0, f"{doc.name} example {name!r} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout


def run_shell(name: str, tmp_path: Path, doc: Path = README, **env: str) -> str:
    """Run ``doc``'s bash block ``name`` with ``bash -e -o pipefail`` in ``tmp_path``; its stdout."""
    lang, code = blocks(doc)[name]
    assert lang == "bash", f"{doc.name} block {name!r} is {lang}, expected bash"
    (tmp_path / "configs").exists() or (tmp_path / "configs").symlink_to(ROOT / "configs")
    bindir = Path(sys.executable).parent  # the `keeper` script installed beside this interpreter
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path,
                         env=example_env(tmp_path, home="RAY_ADDRESS" not in env,
                                         PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", **env),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{doc.name} example {name!r} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout
