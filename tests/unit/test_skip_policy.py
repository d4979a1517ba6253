"""tests/skip_policy.py on planted skips: in CI (``CI=true``) a skip whose reason is not allowed fails the
session (with and without xdist, test-level and module-level), an allowed one does not; outside CI
skips stay skips. Planted mistake each catches: the hook not loaded, or not failing the session."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]

PLANTED = {
    "conftest.py": f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom skip_policy import *  # noqa: F403\n",
    "test_allowed.py": "import pytest\n\n@pytest.mark.skipif(True, reason='needs a GPU')\ndef test_gpu():\n    pass\n\n"
                       "def test_ok():\n    pass\n",
    "test_pillow.py": "import pytest\n\ndef test_image():\n    pytest.skip('pillow is not installed')\n",
    "test_module.py": "import pytest\n\npytest.importorskip('nbdebug_no_such_package')\n\ndef test_x():\n    pass\n",
}


def _run(tmp: pathlib.Path, files: list[str], ci: bool, *args: str) -> subprocess.CompletedProcess[str]:
    for name in ["conftest.py", *files]:
        (tmp / name).write_text(PLANTED[name])
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    if ci:
        env["CI"] = "true"
    # Only the plugins these runs need (xdist when asked): the installed ones' entry points (jaxtyping,
    # typeguard, anyio...) cost ~0.5 CPU-s in each pytest process started here (6 in all).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    plugins = ["-p", "xdist.plugin"] if "-n" in args else []
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugins, "-q", "--rootdir", str(tmp), "-c", os.devnull,
           *args, *files]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


def test_an_unallowed_skip_fails_ci(tmp_path: pathlib.Path) -> None:
    res = _run(tmp_path, ["test_allowed.py", "test_pillow.py"], ci=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SKIPPED IN CI: test_pillow.py::test_image: pillow is not installed" in res.stdout
    assert "test_gpu" not in res.stdout.split("skips CI does not allow")[1]


def test_a_module_skipped_on_an_xdist_worker_fails_ci(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("xdist")
    res = _run(tmp_path, ["test_allowed.py", "test_module.py"], True, "-n", "2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SKIPPED IN CI: test_module.py: could not import 'nbdebug_no_such_package'" in res.stdout


def test_allowed_skips_pass_in_ci_and_any_skip_passes_outside(tmp_path: pathlib.Path) -> None:
    res = _run(tmp_path, ["test_allowed.py"], ci=True)
    assert res.returncode == 0 and "1 passed, 1 skipped" in res.stdout, res.stdout + res.stderr
    res = _run(tmp_path, ["test_allowed.py", "test_pillow.py", "test_module.py"], ci=False)
    assert res.returncode == 0 and "SKIPPED IN CI" not in res.stdout, res.stdout + res.stderr
