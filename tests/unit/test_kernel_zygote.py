"""The forking kernel launcher of the test servers (``tests/kernel_zygote.py``): a kernel forked from
the zygote behaves to its KernelManager as a freshly launched one (runs code, is interrupted,
shuts down with its status, killed without an orphan) and is, inside, the process a fresh launch
would be (environment, cwd, sys.path, signals, seeds), with the zygote's torch.

Each check runs on the real launcher and on a planted mistake: a copy of ``kernel_zygote.py`` with
one line changed (:func:`mutant`), started as zygote or as stub; the check must fail there. Planted
zygotes import IPython and ipykernel but not torch (0.5 CPU-s instead of 3.5) unless the check needs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from tests import kernel_zygote as kz

pytestmark = pytest.mark.slow

SOURCE = Path(kz.__file__)
LIGHT = ("IPython", "ipykernel.kernelapp")
#: the kernels' environment: one torch thread (this machine has two cores, so a zygote whose torch
#: was imported under another OMP_NUM_THREADS would show it)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

PROBE = r"""
import json, os, signal, sys, threading
from ipykernel.kernelapp import IPKernelApp
_status = open("/proc/self/status").read().splitlines()
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path": sys.path, "argv0": sys.argv[0],
    "argv_n": len(sys.argv), "env": dict(os.environ), "umask": os.umask(0o022),
    "threads": sorted(t.name for t in threading.enumerate()), "tasks": len(os.listdir("/proc/self/task")),
    "signals": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals() if signal.getsignal(s) is not None},
    "sigmasks": [ln for ln in _status if ln.startswith(("SigBlk", "SigIgn", "SigCgt"))],
    "main": [sys.modules["__main__"].__name__, getattr(sys.modules["__main__"], "__file__", None)],
    "parent_handle": IPKernelApp.instance().parent_handle, "session_leader": os.getsid(0) == os.getpid(),
    "flags": str(sys.flags),
}))
"""


def mutant(old: str, new: str, stub: bool = False) -> list[str]:
    """A command running ``kernel_zygote.py`` with ``old`` (which must occur once) replaced by ``new``."""
    src = SOURCE.read_text()
    assert src.count(old) == 1, f"the planted mistake must replace one line: {old!r}"
    boot = (f"import sys; sys.path[0] = {str(SOURCE.parent)!r}; "  # as when the file is run as a script
            f"src = open({str(SOURCE)!r}).read().replace({old!r}, {new!r}); "
            f"exec(compile(src, {str(SOURCE)!r}, 'exec'), {{'__name__': '__main__'}})")  # fmt: skip
    return [sys.executable, *(["-I", "-S"] if stub else []), "-c", boot]


@contextlib.contextmanager
def started(tmp: Path, preload: tuple[str, ...] = kz.PRELOAD, program: list[str] | None = None) -> Iterator[kz.Zygote]:
    tmp = tmp / "zygote"  # a cwd of its own: not the kernels'
    tmp.mkdir()
    z = kz.Zygote.start(ENV, str(tmp), preload=preload, program=program)
    try:
        yield z
    finally:
        z.stop()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kz.Zygote]:
    """The real zygote, torch preloaded, for the whole module."""
    with started(tmp_path_factory.mktemp("zygote")) as z:
        yield z


class Kernel:
    """A kernel started by a KernelManager from a kernelspec whose argv is ``argv``."""

    def __init__(self, tmp: Path, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        kz.write_kernelspec(str(tmp / "kernels"), "k", argv)
        self.cwd, self.session = cwd or tmp / "cwd", f"session-{tmp.name}"
        self.cwd.mkdir(exist_ok=True)
        self.km = KernelManager(kernel_name="k", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp / "kernels")]))
        self.km.start_kernel(cwd=str(self.cwd), env={**(env or ENV), "JPY_SESSION_NAME": self.session})
        self.stub = self.km.provisioner.process
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.info = self.run_json(PROBE)

    def run(self, code: str, timeout: float = 120) -> tuple[dict, str]:
        out: list[str] = []
        hook = lambda m: out.append(m["content"]["text"]) if m["msg_type"] == "stream" else None  # noqa: E731
        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return reply["content"], "".join(out)

    def run_json(self, code: str) -> dict:
        content, out = self.run(code)
        assert content["status"] == "ok", content
        return json.loads(out)

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.info["pid"], signal.SIGKILL)  # a planted mistake may leave it behind


@contextlib.contextmanager
def kernel(tmp: Path, argv: list[str], *args, **kw) -> Iterator[Kernel]:
    k = Kernel(tmp, argv, *args, **kw)
    try:
        yield k
    finally:
        k.close()


def gone(pid: int, within: float = 15.0) -> bool:
    """Whether process ``pid`` has ended (and been reaped) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.1)  # polling another process's end: there is no condition to wait on
    return False


# --- the checks -------------------------------------------------------------------------------------
def check_like_fresh(forked: Kernel, fresh: Kernel) -> None:
    """The forked kernel's process is what a fresh launch gives, but for its own pid and session."""
    a, b = dict(forked.info), dict(fresh.info)
    a["env"], b["env"] = dict(a["env"]), dict(b["env"])
    assert a["env"].pop("JPY_SESSION_NAME", None) == forked.session  # the stub's env, not the zygote's
    b["env"].pop("JPY_SESSION_NAME", None)
    assert a["cwd"] == str(forked.cwd)
    for key in ("pid", "ppid"):
        a.pop(key), b.pop(key)
    assert a == b


def check_forked_with_zygote_torch(k: Kernel, z: kz.Zygote) -> None:
    assert k.info["ppid"] == z.pid, "not forked by the zygote"
    first = k.run_json("import json, sys; print(json.dumps([m in sys.modules for m in ('torch', 'torch._dynamo', 'nbdebug')]))")
    assert first == [True, False, False], "torch is the zygote's; torch._dynamo and nbdebug are the kernel's to import"
    assert k.run_json("import torch; print(torch.get_num_threads())") == 1  # the zygote imported torch under the kernels' env


def check_fresh_seeds(a: Kernel, b: Kernel) -> None:
    code = "import json, random, numpy, torch; print(json.dumps([torch.initial_seed(), random.getrandbits(64), int(numpy.random.randint(2**62))]))"
    sa, sb = a.run_json(code), b.run_json(code)
    assert all(x != y for x, y in zip(sa, sb)), (sa, sb)


def check_interrupt(k: Kernel, timeout: float = 60) -> None:
    msg_id = k.kc.execute("import sys, time; print('sleeping'); sys.stdout.flush(); time.sleep(300)")
    while True:  # wait until the cell's own code runs (a SIGINT before that is the kernel's, not the cell's)
        msg = k.kc.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            break
    k.km.interrupt_kernel()
    try:
        reply = k.kc.get_shell_msg(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no reply {timeout} s after the interrupt") from None
    assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    for _ in range(10):  # ipykernel aborts the requests that arrive just after an error (a fresh kernel too)
        content, out = k.run("import os; print(os.getpid())")
        if content["status"] != "aborted":
            break
    assert content["status"] == "ok" and int(out) == k.info["pid"], "the kernel survives"


def check_clean_shutdown(k: Kernel) -> None:
    k.km.shutdown_kernel(now=False)  # a shutdown request; SIGTERM after shutdown_wait_time / 2
    assert k.stub.returncode == 0, f"the stub exits with the kernel's status 0, not {k.stub.returncode}"
    assert gone(k.info["pid"]), "the kernel is reaped"


def check_kill_leaves_no_orphan(k: Kernel) -> None:
    k.km.shutdown_kernel(now=True)  # SIGKILL to the stub's process group
    assert k.stub.returncode == -signal.SIGKILL
    assert gone(k.info["pid"]), "the kernel outlived its stub"


def check_status_mirrored(k: Kernel) -> None:
    os.kill(k.info["pid"], signal.SIGKILL)
    assert k.stub.wait(timeout=30) == -signal.SIGKILL, "the stub dies as the kernel died"


# --- on the real launcher ---------------------------------------------------------------------------
def test_forked_kernel_is_a_fresh_kernel_with_the_zygotes_torch(zygote: kz.Zygote, tmp_path: Path) -> None:
    with kernel(tmp_path / "f", zygote.kernel_argv(), tmp_path) as forked, kernel(tmp_path / "p", kz.plain_argv(), tmp_path) as fresh:
        assert fresh.info["ppid"] == os.getpid()
        check_like_fresh(forked, fresh)
        check_forked_with_zygote_torch(forked, zygote)


def test_each_kernel_draws_fresh_seeds(zygote: kz.Zygote, tmp_path: Path) -> None:
    with kernel(tmp_path / "a", zygote.kernel_argv()) as a, kernel(tmp_path / "b", zygote.kernel_argv()) as b:
        check_fresh_seeds(a, b)


def test_interrupt_shutdown_kill_and_exit_status(zygote: kz.Zygote, tmp_path: Path) -> None:
    with kernel(tmp_path / "i", zygote.kernel_argv()) as k:
        check_interrupt(k)
        k.km.shutdown_wait_time = 60  # the status is checked, not the speed of a loaded machine
        check_clean_shutdown(k)
    with kernel(tmp_path / "k", zygote.kernel_argv()) as k:
        check_kill_leaves_no_orphan(k)
    with kernel(tmp_path / "s", zygote.kernel_argv()) as k:
        check_status_mirrored(k)


def test_refuses_to_fork_for_another_environment(zygote: kz.Zygote, tmp_path: Path) -> None:
    """A kernel whose environment differs in a variable read at import time is launched normally."""
    assert kz.env_mismatch({"A": "1", "JPY_PARENT_PID": "5"}, {"A": "1", "JPY_PARENT_PID": "6"}) == []
    assert kz.env_mismatch({"A": "1", "B": "2"}, {"A": "2"}) == ["A", "B"]
    with kernel(tmp_path, zygote.kernel_argv(), env={**ENV, "OMP_NUM_THREADS": "2"}) as k:
        assert k.info["ppid"] == os.getpid(), "the stub exec'd a normal kernel"
        assert k.info["pid"] == k.stub.pid


def test_kernels_die_with_the_zygote(tmp_path: Path) -> None:
    with started(tmp_path, LIGHT) as z, kernel(tmp_path, z.kernel_argv()) as k:
        z.proc.kill()
        assert gone(k.info["pid"]), "PR_SET_PDEATHSIG"
        assert k.stub.wait(timeout=30) == 1


# --- on planted mistakes ----------------------------------------------------------------------------
LIKE_FRESH = {
    "no chdir": ('os.chdir(req["cwd"])', "pass"),
    "the zygote's environment": ('os.environ.clear()\n    os.environ.update(req["env"])', "pass"),
    "the zygote's sys.path": ('sys.path[:] = [os.getcwd(), *req["base_path"]]', "pass"),
    "kernelapp imported in the zygote": ('REIMPORT = ("ipykernel.kernelapp",)', "REIMPORT = ()"),
}


@pytest.mark.parametrize("old,new", LIKE_FRESH.values(), ids=LIKE_FRESH.keys())
def test_like_fresh_catches(old: str, new: str, tmp_path: Path) -> None:
    with started(tmp_path, LIGHT, mutant(old, new)) as z, kernel(tmp_path / "f", z.kernel_argv(), tmp_path) as forked, kernel(tmp_path / "p", kz.plain_argv(), tmp_path) as fresh:
        with pytest.raises(AssertionError):
            check_like_fresh(forked, fresh)


def test_torch_check_catches_a_zygote_without_torch(tmp_path: Path) -> None:
    with started(tmp_path, LIGHT) as z, kernel(tmp_path, z.kernel_argv()) as k, pytest.raises(AssertionError):
        check_forked_with_zygote_torch(k, z)


def test_seed_check_catches_a_zygote_that_does_not_reseed(tmp_path: Path) -> None:
    with started(tmp_path, ("torch", *LIGHT), mutant('sys.modules["torch"].seed()', "pass")) as z:
        with kernel(tmp_path / "a", z.kernel_argv()) as a, kernel(tmp_path / "b", z.kernel_argv()) as b:
            with pytest.raises(AssertionError):
                check_fresh_seeds(a, b)


def test_interrupt_check_catches_a_stub_that_does_not_forward(zygote: kz.Zygote, tmp_path: Path) -> None:
    argv = zygote.kernel_argv(mutant("lambda signum, _frame: _forward(pid, signum)", "lambda signum, _frame: None", stub=True))
    with kernel(tmp_path, argv) as k, pytest.raises(AssertionError, match="no reply"):
        check_interrupt(k, timeout=10)


def test_interrupt_check_catches_a_blocked_sigint_left_blocked(tmp_path: Path) -> None:
    program = mutant("    signal.pthread_sigmask(signal.SIG_SETMASK, [])\n    os.umask",
                     "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n    os.umask")  # fmt: skip
    with started(tmp_path, LIGHT, program) as z, kernel(tmp_path, z.kernel_argv()) as k:
        with pytest.raises(AssertionError, match="no reply"):
            check_interrupt(k, timeout=10)


def test_shutdown_check_catches_a_stub_that_never_exits(zygote: kz.Zygote, tmp_path: Path) -> None:
    argv = zygote.kernel_argv(mutant('_exit_like(done["exit"])', "pass", stub=True))
    with kernel(tmp_path, argv) as k, pytest.raises(AssertionError, match="status 0"):
        k.km.shutdown_wait_time = 2
        check_clean_shutdown(k)


def test_orphan_check_catches_a_zygote_that_does_not_kill(tmp_path: Path) -> None:
    program = mutant("                    _kill_group(kid.pid)\n                    sel.unregister(kid.conn)",
                     "                    sel.unregister(kid.conn)")  # fmt: skip
    with started(tmp_path, LIGHT, program) as z, kernel(tmp_path, z.kernel_argv()) as k:
        with pytest.raises(AssertionError, match="outlived"):
            check_kill_leaves_no_orphan(k)


def test_status_check_catches_a_stub_that_exits_0(zygote: kz.Zygote, tmp_path: Path) -> None:
    argv = zygote.kernel_argv(mutant('_exit_like(done["exit"])', "os._exit(0)", stub=True))
    with kernel(tmp_path, argv) as k, pytest.raises(AssertionError, match="dies as"):
        check_status_mirrored(k)


def test_zygote_with_a_thread_refuses_to_fork(tmp_path: Path) -> None:
    """Fork copies one thread: a zygote with two (a planted one) launches kernels normally."""
    program = mutant("    base_env = dict(os.environ)\n",
                     "    base_env = dict(os.environ)\n    import threading, time; threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()\n")  # fmt: skip
    with started(tmp_path, LIGHT, program) as z, kernel(tmp_path, z.kernel_argv()) as k:
        assert k.info["ppid"] == os.getpid() and k.info["pid"] == k.stub.pid
        assert "threads" in Path(z.log).read_text()
