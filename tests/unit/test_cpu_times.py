"""tests/cpu_times.py: each test's CPU seconds go into the junit XML and the terminal summary, and a
test that waits is not charged for the time it waited (planted mistake caught: wall time recorded
instead of CPU time, or the property lost between an xdist worker and the controller's junit)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_cpu_seconds_per_test_in_junit_and_summary(tmp_path: pathlib.Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "import cpu_times\n\ndef pytest_configure(config):\n    cpu_times.register(config)\n"
    )
    (tmp_path / "test_x.py").write_text(
        "import time\n\n"
        "def test_burns():\n    t = time.process_time()\n    while time.process_time() - t < 0.3:\n        pass\n\n"
        "def test_waits():\n    time.sleep(0.3)\n"
    )
    junit = tmp_path / "out.xml"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", f"--rootdir={tmp_path}",
         f"--junitxml={junit}", str(tmp_path / "test_x.py")],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    cpu = {case.get("name"): float(prop.get("value")) for case in ET.parse(junit).getroot().iter("testcase")
           for prop in case.iter("property") if prop.get("name") == "cpu_s"}
    assert cpu.keys() == {"test_burns", "test_waits"}
    assert 0.28 <= cpu["test_burns"] < 1.0 and cpu["test_waits"] < 0.1, cpu
    lines = res.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if "slowest 25 by CPU" in ln)
    assert lines[head + 1].endswith("test_x.py::test_burns")  # the slowest first
