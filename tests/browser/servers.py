"""JupyterLab / Notebook 7 servers for the browser tier, each isolated in its own temp dir.

Started the way ``/work/shared/BROWSER_TESTING.md`` documents: the venv's python, 127.0.0.1, a
free port with no retries, a random token, every Jupyter/IPython dir in the temp dir, the news
toast off, ``--expose-app-in-browser``. Stopped with SIGTERM (the server shuts its kernels down).

Each server's ``python3`` kernelspec (in its temp ``JUPYTER_PATH``) forks its kernels from a zygote that has
imported torch and ipykernel once (``tests/kernel_zygote.py``; ``NBDEBUG_TEST_ZYGOTE=0``: the installed
spec); ``python3-plain`` (:data:`PLAIN_KERNEL`) launches a kernel normally.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests import kernel_zygote

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
SERVER_START_S = 120
# The harness' timeouts (milliseconds) that held under load on 2 cores.
KERNEL_IDLE_MS = 90_000
WIDGET_MS = 60_000
RUN_ALL_MS = 180_000
CELL_MS = 60_000
PAGE_LOAD_MS = 90_000
# The harness's waits on a page condition check it every 50 ms, not on every animation frame
# (Playwright's default): a frame-rate check makes chromium produce 60 frames a second for the whole
# wait (measured on a loaded JupyterLab page: ~0.06 CPU-s per second of waiting with it, ~0.01
# without; a run-all waits tens of seconds; the canvas check reads every pixel at each check).
# Seven Lab/Notebook 7 tests side by side at load 17: chromium 78.9 CPU-s -> 62.6.
# (NBDEBUG_BROWSER_POLL=raf: Playwright's default, to measure the difference.)
POLL_MS: int | str = os.environ.get("NBDEBUG_BROWSER_POLL", "50")
POLL_MS = POLL_MS if POLL_MS == "raf" else int(POLL_MS)

#: a kernelspec every server has that launches kernels normally, whether or not its python3 spec forks
PLAIN_KERNEL = "python3-plain"
App = Literal["lab", "notebook"]
_workspace_ids = itertools.count()


def ipynb(name: str) -> str:
    """``name`` with the ``.ipynb`` suffix."""
    return name if name.endswith(".ipynb") else f"{name}.ipynb"


@dataclass
class JupyterServer:
    """A running JupyterLab or Notebook 7 server on 127.0.0.1 with its own temp dirs."""

    app: App
    port: int
    token: str
    root: Path  # root_dir: notebooks written here can be opened
    home: Path  # the temp dir holding root/, config, runtime, settings, ...
    proc: subprocess.Popen[bytes]
    log: Path
    kernels_started: list[str] = field(default_factory=list)
    zygote: kernel_zygote.Zygote | None = None  # forks the python3 kernels (None: launched normally)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, name: str) -> str:
        """URL opening notebook ``name`` (relative to root) in this server's front-end."""
        name = ipynb(name)
        if self.app == "lab":
            # A fresh workspace per page: the default one would reopen every earlier notebook.
            ws = f"nbdebug-{next(_workspace_ids)}"
            return f"{self.base}/lab/workspaces/{ws}/tree/{name}?token={self.token}"
        return f"{self.base}/notebooks/{name}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> Any:
        """Call the REST API; returns the decoded JSON (or None for empty answers)."""
        sep = "&" if "?" in path else "?"
        req = urllib.request.Request(f"{self.base}{path}{sep}token={self.token}", method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_sessions(self) -> None:
        """Delete every session (and so every kernel): tests do not leave kernels running."""
        try:
            for s in self.api("/api/sessions") or []:
                self.api(f"/api/sessions/{s['id']}", method="DELETE")
            for k in self.api("/api/kernels") or []:
                self.api(f"/api/kernels/{k['id']}", method="DELETE")
        except (urllib.error.URLError, OSError):
            pass

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (the server shuts its kernels down), SIGKILL if it does not exit in 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.zygote is not None:
            self.zygote.stop()  # after the server: it has shut its kernels down
        ARTIFACTS.mkdir(exist_ok=True)
        logs = [(self.log, f"jupyter-{self.app}.log")]
        if self.zygote is not None:
            logs.append((Path(self.zygote.log), f"kernel-zygote-{self.app}.log"))
        for src, name in logs:
            try:
                shutil.copy(src, ARTIFACTS / name)
            except OSError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings: Path) -> None:
    files = {
        # The "Jupyter news?" toast covers the page.
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        # Keep every cell in the DOM (long notebooks otherwise detach off-screen cells).
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }
    for rel, value in files.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def start_server(app: App, attempts: int = 3) -> JupyterServer:
    """Start JupyterLab (``app="lab"``) or Notebook 7 and wait until ``/api/status`` answers."""
    last = ""
    for _ in range(attempts):
        server = _spawn(app)
        ok, last = _wait_ready(server)
        if ok:
            return server
        server.stop()
    raise RuntimeError(f"Jupyter {app} server did not start:\n{last}")


def _spawn(app: App) -> JupyterServer:
    home = Path(tempfile.mkdtemp(prefix=f"nbdebug-{app}-"))
    root = home / "root"
    root.mkdir()
    dirs = {
        "JUPYTER_CONFIG_DIR": home / "config",
        "JUPYTER_RUNTIME_DIR": home / "runtime",
        "JUPYTER_DATA_DIR": home / "data",
        "JUPYTERLAB_SETTINGS_DIR": home / "settings",
        "JUPYTERLAB_WORKSPACES_DIR": home / "workspaces",
        "IPYTHONDIR": home / "ipython",
        # first on the kernelspec path (in a venv the data dir comes after the venv's own python3 spec)
        "JUPYTER_PATH": home / "share",
    }
    for d in dirs.values():
        d.mkdir()
    _write_settings(dirs["JUPYTERLAB_SETTINGS_DIR"])
    env = {**os.environ, **{k: str(v) for k, v in dirs.items()}}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(
        JUPYTER_PLATFORM_DIRS="1",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
        # One torch (OpenMP) thread per kernel: the tier runs two workers on two cores, and a second
        # thread per kernel spins for work (tutorial 1's training cell: 15.7 → 10.9 CPU-s, same numbers)
        OMP_NUM_THREADS="1",
    )
    kernels = str(dirs["JUPYTER_PATH"] / "kernels")
    kernel_zygote.write_kernelspec(kernels, PLAIN_KERNEL)
    # The zygote gets the server's environment: the kernels' (variables read when torch is imported,
    # like OMP_NUM_THREADS, are theirs). It imports while the server starts.
    zygote = kernel_zygote.Zygote.start(env, str(home)) if kernel_zygote.enabled() else None
    if zygote is not None:
        zygote.write_kernelspec(kernels, "python3")
    port, token = _free_port(), secrets.token_hex(16)
    module = "jupyterlab.labapp" if app == "lab" else "notebook.app"
    cmd = [
        sys.executable, "-m", module,
        "--no-browser", "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--expose-app-in-browser",
    ]  # fmt: skip
    log = home / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=root)
    return JupyterServer(app=app, port=port, token=token, root=root, home=home, proc=proc, log=log, zygote=zygote)


def _wait_ready(server: JupyterServer) -> tuple[bool, str]:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return False, f"exited with {server.proc.returncode}:\n{server.log_tail()}"
        try:
            server.api("/api/status")
            return True, ""
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)  # polling a process we started, not waiting on the UI
    return False, f"no answer on /api/status after {SERVER_START_S} s:\n{server.log_tail()}"
