"""A forking kernel launcher for the browser tier's Jupyter servers (issue 30; the tutorial tests launch
theirs normally).

Every kernel a test starts pays ``import torch`` (~3 CPU-s) and ipykernel/IPython (~0.3) before its
first cell. A *zygote* (one per server) has done those imports once; a kernel is a ``fork()`` of it.
What a kernel imports beyond them (nbdebug, ``torch._dynamo``) it imports itself, as a user's kernel would.

The kernelspec's argv (:meth:`Zygote.write_kernelspec`) is a stub, ``python -I -S kernel_zygote.py
stub SOCKET -f {connection_file}`` (~0.03 CPU-s), that sends the zygote its argv, environment, cwd,
umask and stdio (``SCM_RIGHTS``) over a unix socket; the zygote forks a child that becomes
``python -m ipykernel_launcher -f ...`` with exactly those (``os.environ`` replaced, ``chdir``,
``sys.argv``/``sys.path``/``__main__`` as ``-m`` sets them, a fresh interpreter's signal handlers and
mask, a session of its own as ``start_new_session`` gives, fresh seeds). To the server the stub *is*
the kernel: it forwards SIGINT (interrupt), SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 to the child's process
group; it exits with the child's status (a signal death re-raised); SIGKILLed, it closes its socket
and the zygote SIGKILLs the child's group; a dead zygote takes its children along
(``PR_SET_PDEATHSIG``). The zygote refuses to fork (the stub then ``exec``s a normal kernel and says
why on stderr) when the stub's environment differs from its own but in :data:`PER_KERNEL_ENV` (what
is read at import time must be the kernel's), when the python differs, or when it has a second thread
(fork copies one; torch started its OpenMP pool, e.g. without ``OMP_NUM_THREADS=1``).

``NBDEBUG_TEST_ZYGOTE=0`` turns it off (:func:`enabled`). Known differences from a fresh kernel: the
string hash seed is the zygote's; ``sys.orig_argv`` and ``/proc/<pid>/cmdline`` are the zygote's;
torch is in ``sys.modules`` before the first cell; at exit the module teardown is skipped (threads
joined, atexit callbacks run, streams flushed). Run as ``serve LISTENING-FD [MODULE,...]`` (the zygote)
or ``stub SOCKET ARGS...``; only the standard library is imported at module level (the stub's ``-S``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

#: what a fresh interpreter's signal handlers are (this file is imported or run before anything else
#: installs one); the zygote's children are given these back
FRESH_SIGNALS = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}
#: signals the stub forwards to its kernel (SIGKILL cannot be caught: the zygote sees the socket close)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: variables a kernel's environment may differ in from the zygote's: set per kernel by jupyter_client
#: and jupyter_server, or per test by pytest, and read at run time. (``JPY_PARENT_PID`` is read when
#: ``ipykernel.kernelapp`` is imported: the zygote imports that module's imports, not the module.)
PER_KERNEL_ENV = frozenset({"JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTEST_CURRENT_TEST"})
#: modules a kernel imports anyway, imported once in the zygote (nbdebug, torch._dynamo: never)
PRELOAD = ("torch", "IPython", "ipykernel.kernelapp")
#: modules the zygote imports for the kernel's imports but drops, so the child imports them afresh
REIMPORT = ("ipykernel.kernelapp",)
MAX_MSG = 1 << 20


def enabled() -> bool:
    """Whether the browser tier's servers launch their python3 kernels through a zygote (``NBDEBUG_TEST_ZYGOTE=0``: no)."""
    return os.environ.get("NBDEBUG_TEST_ZYGOTE", "1") != "0"


# ---------------------------------------------------------------------------------------------------
# The stub: what the Jupyter server launches
# ---------------------------------------------------------------------------------------------------
def _launch_normally(kernel_args: list[str], why: str) -> None:
    sys.stderr.write(f"[kernel_zygote] {why}: launching the kernel normally\n")
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # exec keeps the mask: give python -m an empty one
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *kernel_args])


def _forward(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # the child leads its own session: its group is the kernel and its subprocesses
    except ProcessLookupError:
        pass  # the kernel has exited; its status is on its way


def _exit_like(status: int) -> None:
    """End this process as the kernel ended: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # not reached: the signal's default action ends this process
    os._exit(os.WEXITSTATUS(status))


def stub(sock_path: str, kernel_args: list[str]) -> None:
    """Ask the zygote at ``sock_path`` for a kernel run with ``kernel_args`` and stand in for it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the kernel's pid is known
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(sock_path)
    except OSError as exc:
        _launch_normally(kernel_args, f"no zygote at {sock_path} ({exc})")
    mask = os.umask(0)
    os.umask(mask)
    request = {"argv": kernel_args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask,
               "executable": sys.executable}  # fmt: skip
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    reply = json.loads(conn.recv(MAX_MSG) or b'{"fallback": "the zygote closed the connection"}')
    if "fallback" in reply:
        conn.close()
        _launch_normally(kernel_args, f"zygote refused: {reply['fallback']}")
    pid = reply["pid"]
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(pid, signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        msg = conn.recv(MAX_MSG)  # retried after a forwarded signal (PEP 475)
        if not msg:  # the zygote died: PR_SET_PDEATHSIG has killed the kernel
            sys.stderr.write("[kernel_zygote] the zygote exited before the kernel\n")
            os._exit(1)
        done = json.loads(msg)
        if "exit" in done:
            _exit_like(done["exit"])


# ---------------------------------------------------------------------------------------------------
# The zygote
# ---------------------------------------------------------------------------------------------------
def threads() -> int:
    """How many threads this process has."""
    return len(os.listdir("/proc/self/task"))


def env_mismatch(kernel: dict[str, str], zygote: dict[str, str]) -> list[str]:
    """Variables whose value differs between a kernel's and the zygote's environment, but the per-kernel ones."""
    return sorted(k for k in kernel.keys() | zygote.keys() if k not in PER_KERNEL_ENV and kernel.get(k) != zygote.get(k))


def _preload(modules: tuple[str, ...]) -> None:
    import importlib

    for name in modules:
        importlib.import_module(name)
    for name in REIMPORT:
        if name not in sys.modules:
            continue
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            delattr(sys.modules[parent], child)
    bad = [m for m in ("nbdebug", "torch._dynamo", "numpy.random") if m in sys.modules]
    if bad:
        raise RuntimeError(f"the zygote must not import {bad}: kernels would not pay for them")


class _Kid:
    def __init__(self, pid: int, conn: socket.socket | None, pidfd: int) -> None:
        self.pid, self.conn, self.pidfd = pid, conn, pidfd


def serve(listen_fd: int, preload: tuple[str, ...] = PRELOAD) -> dict | None:
    """The zygote: accept on the listening socket ``listen_fd`` (bound by :meth:`Zygote.start`, so a
    stub never finds it missing), import ``preload``, fork a kernel per request. Returns (in
    a forked child only) the request the child is to run; the zygote itself exits when its stdin closes."""
    import selectors

    base_path = sys.path[1:] if not sys.flags.safe_path else sys.path[:]  # without this script's dir
    listener = socket.socket(fileno=listen_fd)  # stubs that connect during the preload wait in its backlog
    _preload(preload)
    base_env = dict(os.environ)
    me = os.getpid()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(0, selectors.EVENT_READ, "lifeline")
    kids: dict[int, _Kid] = {}
    print(f"[kernel_zygote] pid {me} ready on {listener.getsockname()}", flush=True)
    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "lifeline":
                if not os.read(0, 4096):  # whoever started the zygote is gone: so are its kernels
                    for kid in kids.values():
                        _kill_group(kid.pid)
                    print(f"[kernel_zygote] stdin closed, exiting ({len(kids)} kernels killed)", flush=True)
                    os._exit(0)
            elif what == "accept":
                conn, _ = listener.accept()
                child = _accept(conn, base_env, kids, sel)
                if child is not None:  # in the forked child: leave the zygote's loop
                    for obj in (listener, sel, *(k.conn for k in kids.values() if k.conn), conn):
                        obj.close()
                    for kid in kids.values():
                        os.close(kid.pidfd)
                    child["base_path"] = base_path
                    child["zygote"] = me
                    return child
            elif what[0] == "exit":
                _reap(kids.pop(what[1]), sel)
            elif what[0] == "conn":
                kid = kids[what[1]]
                assert kid.conn is not None
                if not kid.conn.recv(MAX_MSG):  # the stub is gone (SIGKILL): no orphan kernel
                    _kill_group(kid.pid)
                    sel.unregister(kid.conn)
                    kid.conn.close()
                    kid.conn = None


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            continue


def _reap(kid: _Kid, sel) -> None:
    _, status, use = os.wait4(kid.pid, 0)
    print(f"[kernel_zygote] kernel {kid.pid} exited (status {status}): {use.ru_utime:.2f} user + {use.ru_stime:.2f} sys CPU-s", flush=True)
    sel.unregister(kid.pidfd)
    os.close(kid.pidfd)
    if kid.conn is not None:
        try:
            kid.conn.send(json.dumps({"exit": status}).encode())
        except OSError:
            pass  # the stub is gone
        sel.unregister(kid.conn)
        kid.conn.close()


def _accept(conn: socket.socket, base_env: dict[str, str], kids: dict[int, _Kid], sel) -> dict | None:
    """Serve one connection: a refusal or a fork. Returns the request in the forked child."""
    import selectors

    conn.settimeout(30)
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 3)
    except OSError:
        conn.close()
        return None
    req = json.loads(msg or b"{}")
    why = ""
    if len(fds) != 3 or "env" not in req:
        why = "malformed request"
    elif req["executable"] != sys.executable:
        why = f"python {req['executable']} is not the zygote's {sys.executable}"
    elif diff := env_mismatch(req["env"], base_env):
        why = f"the environment differs from the zygote's in {diff}"
    elif (n := threads()) != 1:
        why = f"the zygote has {n} threads (a fork copies no thread but this one)"
    if why:
        print(f"[kernel_zygote] refused: {why}", flush=True)
        conn.send(json.dumps({"fallback": why}).encode())
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.setsid()  # as start_new_session: the stub's forwarded killpg reaches this group
        os.close(ready_w)
        req["fds"] = fds
        return req
    os.close(ready_w)
    os.read(ready_r, 1)  # EOF once the child leads its session
    os.close(ready_r)
    for fd in fds:
        os.close(fd)
    kid = _Kid(pid, conn, os.pidfd_open(pid))
    kids[pid] = kid
    sel.register(kid.pidfd, selectors.EVENT_READ, ("exit", pid))
    sel.register(conn, selectors.EVENT_READ, ("conn", pid))
    conn.send(json.dumps({"pid": pid}).encode())
    return None


def become_kernel(req: dict) -> None:
    """In a forked child: turn into ``python -m ipykernel_launcher ARGS`` as the stub would have run it."""
    import ctypes
    import runpy
    import types

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the zygote
    if os.getppid() != req["zygote"]:
        os._exit(1)
    for target, fd in enumerate(req["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    for sig, handler in FRESH_SIGNALS.items():
        if handler is not None:
            try:
                signal.signal(sig, handler)
            except (OSError, ValueError):
                pass  # a signal the C library keeps for itself
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.umask(req["umask"])
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[:] = [os.getcwd(), *req["base_path"]]  # as `python -m` sets it (the launcher drops [0])
    # fresh seeds, as a new process draws them (random reseeds itself at fork; numpy.random is not loaded)
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv[:] = ["-m", *req["argv"]]
    try:
        runpy._run_module_as_main("ipykernel_launcher")  # what `python -m ipykernel_launcher` runs
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    _exit_without_teardown(code)


def _exit_code(exc: SystemExit) -> int:
    """The exit status Python gives ``SystemExit(exc.code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _exit_without_teardown(code: int) -> None:
    """Exit as the interpreter does (wait for non-daemon threads, run atexit callbacks, flush the
    standard streams) but skip the module teardown: in a forked child it writes the reference count of
    every object the zygote imported, and so copies each of its pages (~0.6 CPU-s; a fresh kernel's
    teardown costs ~0.4)."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------------
# The test side: start a zygote, write its kernelspec
# ---------------------------------------------------------------------------------------------------
class Zygote:
    """A running zygote (``start``), its socket and log; ``stop()`` kills it and its kernels."""

    def __init__(self, proc, sock: str, log: str) -> None:
        self.proc, self.sock, self.log = proc, sock, log

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, env: dict[str, str], workdir: str, preload: tuple[str, ...] = PRELOAD,
              program: list[str] | None = None) -> Zygote:  # fmt: skip
        """Start a zygote with environment ``env`` (the kernels' environment: variables read at import
        time, like ``OMP_NUM_THREADS``, must be theirs), its socket and log in ``workdir``. Returns at
        once: stubs that connect while it imports wait for it. ``program``: the command that runs this
        file (default ``python kernel_zygote.py``; the unit tests run modified copies of it)."""
        import subprocess

        program = program or [sys.executable, os.path.abspath(__file__)]
        sock = os.path.join(workdir, "kernel-zygote.sock")
        log = os.path.join(workdir, "kernel-zygote.log")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with listener, open(log, "ab") as fh:
            listener.bind(sock)
            listener.listen(64)
            proc = subprocess.Popen(
                [*program, "serve", str(listener.fileno()), ",".join(preload)], env=env,
                stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT, cwd=workdir,
                start_new_session=True, pass_fds=[listener.fileno()],
            )  # fmt: skip
        return cls(proc, sock, log)

    def kernel_argv(self, program: list[str] | None = None) -> list[str]:
        """A kernelspec's argv: the stub (run by ``program``, default this file under ``-I -S``)."""
        program = program or [sys.executable, "-I", "-S", os.path.abspath(__file__)]
        return [*program, "stub", self.sock, "-f", "{connection_file}"]

    def write_kernelspec(self, kernels_dir: str, name: str = "python3") -> str:
        """Write kernelspec ``name`` launching through this zygote into ``kernels_dir`` (a ``kernels/``
        directory of a Jupyter data path); otherwise the same as the installed ``python3`` spec."""
        return write_kernelspec(kernels_dir, name, self.kernel_argv())

    def stop(self) -> None:
        """Close its stdin (it kills its remaining kernels and exits); SIGKILL if it does not."""
        import subprocess

        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if os.path.exists(self.sock):
            os.unlink(self.sock)


def plain_argv() -> list[str]:
    """The installed ``python3`` kernelspec's argv: a normal launch."""
    return [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def write_kernelspec(kernels_dir: str, name: str, argv: list[str] | None = None) -> str:
    """Write kernelspec ``name`` into ``kernels_dir``: the installed ``python3`` spec (display name,
    metadata), with ``argv`` if given. Returns the spec's directory."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3").to_dict()
    spec["argv"] = argv or plain_argv()
    path = os.path.join(kernels_dir, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "kernel.json"), "w") as fh:
        json.dump(spec, fh, indent=1)
    return path


def main(argv: list[str]) -> None:
    if argv[:1] == ["stub"]:
        stub(argv[1], argv[2:])
    elif argv[:1] == ["serve"]:
        req = serve(int(argv[1]), *([tuple(m for m in argv[2].split(",") if m)] if len(argv) > 2 else []))
        if req is not None:  # a forked child, out of the zygote's loop with a clean stack
            become_kernel(req)
    else:
        sys.exit("usage: kernel_zygote.py serve LISTENING-FD [MODULE,...] | stub SOCKET KERNEL-ARGS...")


if __name__ == "__main__":
    main(sys.argv[1:])
