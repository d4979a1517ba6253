"""`make setup` leaves js/package-lock.json as committed: the lock is the one this npm writes, so
`npm ci` accepts it and `npm install` has nothing to rewrite (issue 30: npm 11 added the optional rollup
platform packages, +345 lines, to every fresh clone's lock). Planted mistake caught: a lock written by
another npm (or package.json changed without its lock), and the Makefile back on `npm install`."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

JS = pathlib.Path(__file__).resolve().parents[2] / "js"


def test_npm_would_not_rewrite_the_lock(tmp_path: pathlib.Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm not on PATH")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(JS / name, tmp_path / name)
    # what `npm install` would write, resolved from npm's cache (set-up filled it; no network)
    res = subprocess.run([npm, "install", "--package-lock-only", "--offline", "--no-audit", "--no-fund", "--ignore-scripts"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "package-lock.json").read_text() == (JS / "package-lock.json").read_text(), (
        "npm rewrites js/package-lock.json: regenerate it once with `cd js && npm install --package-lock-only` and commit it")


def test_setup_installs_with_npm_ci() -> None:
    makefile = (JS.parent / "Makefile").read_text()
    assert "cd js && npm ci --no-audit --no-fund" in makefile
    assert "npm install" not in makefile.replace("npm install --package-lock-only", "")
