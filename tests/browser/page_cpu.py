"""What a JupyterLab / Notebook 7 page costs chromium, in CPU seconds (user + sys of every chromium
process, read from ``/proc`` every 0.25 s): a load, an idle minute with a notebook open, a run that
draws a widget, an idle minute with the widget shown, one more notebook opened in the loaded page.
Not a test; a measuring tool for issue 30 (``cpu_split.py`` splits a whole run by kind).

    python -m tests.browser.page_cpu [--idle 60] [--app lab,notebook] [--arg=--some-chromium-flag]

Runs its own servers and chromium (``harness.CHROMIUM_ARGS`` + the ``--arg`` flags); the idle
phases sleep in Python, so nothing polls the page while they are measured.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from . import harness
from .harness import run_js, wait_kernel_idle, wait_widget, write_notebook

TICK = os.sysconf("SC_CLK_TCK")
CELLS = [
    "%load_ext nbdebug",
    "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
    "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))\n"
    "x = torch.randn(2, 3, 16, 16)",
    "%%nndebug model --view thermometer\nmodel(x).sum().backward()",
]


def chromium_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + sys) of every chromium process below ``root`` (this process), including
    the exited ones: a zombie by its own times (found by its name: a zombie has no command line),
    a reaped one in its parent's ``cutime``/``cstime`` (a closed context's renderer is reaped by
    chromium's zygote). So two readings subtract exactly."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[str, list[str]]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                head, tail = open(f"/proc/{d}/stat").read().rsplit(")", 1)
            except OSError:
                continue
            stats[int(d)] = (head.split("(", 1)[1], tail.split())
    kids: dict[int, list[int]] = {}
    for pid, (_, fields) in stats.items():
        kids.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0.0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        name, fields = stats[pid]
        if name == "chromium":
            total += sum(int(x) for x in fields[11:15]) / TICK  # utime stime cutime cstime
    return total


def by_type() -> str:
    """CPU seconds of each live chromium process by its ``--type`` (browser: none), largest first."""
    out: dict[str, float] = {}
    for d in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{d}/cmdline").read().replace("\0", " ").split() if d.isdigit() else []
            fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split() if cmd else []
        except OSError:
            continue
        if cmd and cmd[0].endswith("chromium/chromium") and int(fields[1]) != 1:
            kind = next((a[7:] for a in cmd if a.startswith("--type=")), "browser")
            kind += "(webui)" if "--top-chrome-webui" in cmd else ""
            out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(out.items(), key=lambda kv: -kv[1]))


class ChromiumCpu:
    """Chromium's CPU seconds below this process (:func:`chromium_cpu_seconds`)."""

    def total(self) -> float:
        return chromium_cpu_seconds()


def phase(cpu: ChromiumCpu, name: str, fn: Any, rows: list[str]) -> None:
    t0, w0 = cpu.total(), time.monotonic()
    fn()
    used, wall = cpu.total() - t0, time.monotonic() - w0
    rows.append(f"{name:<44} {used:7.2f} CPU-s  {wall:6.1f} s wall  ({used / wall * 60:5.2f} CPU-s/min)")
    print(rows[-1], flush=True)


def run_app(browser: Any, app: harness.App, idle: float, context_kw: dict[str, Any], cpu: ChromiumCpu,
            settings: list[str]) -> list[str]:
    server = harness.start_server(app)
    rows: list[str] = [f"--- {app}"]
    try:
        for spec in settings:  # e.g. @jupyterlab/codemirror-extension/plugin={"defaultConfig": {...}}
            rel, value = spec.split("=", 1)
            path = server.home / "settings" / f"{rel}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
        write_notebook(server.root, "probe", CELLS)
        write_notebook(server.root, "probe2", ["print(1)"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, **context_kw)
        context.set_default_timeout(harness.WIDGET_MS)
        page = context.new_page()
        phase(cpu, "load (goto + kernel idle)", lambda: harness.open_notebook(page, server, "probe"), rows)
        phase(cpu, f"idle {idle:.0f} s, notebook open", lambda: time.sleep(idle), rows)

        def run() -> None:
            run_js(page, "await app.commands.execute('notebook:run-all-cells');", timeout=harness.RUN_ALL_MS)
            wait_widget(page, "thermometer")

        phase(cpu, "run all + widget drawn", run, rows)
        phase(cpu, f"idle {idle:.0f} s, widget shown", lambda: time.sleep(idle), rows)
        page.mouse.click(5, 500)  # focus away from any editor
        phase(cpu, f"idle {idle:.0f} s, after a click outside", lambda: time.sleep(idle), rows)
        if app == "lab":

            def open2() -> None:
                run_js(page, "const w = await app.commands.execute('docmanager:open', {path: arg, factory: 'Notebook'});"
                       " app.shell.activateById(w.id);", "probe2.ipynb")
                wait_kernel_idle(page, "probe2")

            phase(cpu, "open a 2nd notebook in the loaded page", open2, rows)
        rows.append(f"by process type before closing the context: {by_type()}")
        context.close()
    finally:
        server.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--app", default="lab,notebook")
    ap.add_argument("--arg", action="append", default=[], help="one more chromium flag")
    ap.add_argument("--reduced-motion", action="store_true")
    ap.add_argument("--setting", action="append", default=[], help="@scope/plugin-extension/file=JSON: a Lab setting file")
    opts = ap.parse_args()
    from playwright.sync_api import sync_playwright

    cpu = ChromiumCpu()
    kw = {"reduced_motion": "reduce"} if opts.reduced_motion else {}
    rows = [f"chromium args: {harness.CHROMIUM_ARGS + opts.arg} {kw} {opts.setting}"]
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=harness.CHROMIUM, headless=True, args=harness.CHROMIUM_ARGS + opts.arg)
        rows.append(f"{'chromium start':<44} {cpu.total():7.2f} CPU-s")
        for app in opts.app.split(","):
            rows += run_app(b, app, opts.idle, kw, cpu, opts.setting)  # type: ignore[arg-type]
        b.close()
    print("\n".join(rows))
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
