"""Compiling and loading the native statistics kernel (``_native/stats.c``) for :mod:`.native`.

The source is compiled with the system C compiler (``$CC`` or ``cc``; :data:`FLAGS`; on x86-64
Linux with gcc the hot loops are cloned for x86-64-v4/v3/baseline and picked at load time, never
``-march=native``) into ``cache_dir()/<key>/libnbdstats.so``, where ``key`` hashes the source, the
compiler (path, size, mtime, extra arguments), the flags and the platform: a changed source or
compiler builds a new library, an unchanged one is only loaded. The build runs in a private
temporary directory next to the target and is moved in place with ``os.replace`` (atomic), so
kernels or processes starting at once never load a half-written file; the loser of a race just
replaces the file with an identical one. A loaded library must pass a self-test on a known array.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import numpy as np

SRC = pathlib.Path(__file__).with_name("_native") / "stats.c"
ABI = 2  # nbd_abi() of a library this Python side can drive
FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden")
LIB_NAME = "libnbdstats.so"


def cache_dir() -> pathlib.Path:
    """Where compiled kernels live (one subdirectory per source/compiler/flags/platform key)."""
    env = os.environ.get("NBDEBUG_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return root / "nbdebug" / "native"


def _compiler() -> tuple[list[str], str] | str:
    """``(argv, identity)`` of the C compiler, or the reason there is none."""
    cc = os.environ.get("CC") or "cc"
    try:
        argv = shlex.split(cc)
    except ValueError:
        return f"unusable CC={cc!r}"
    exe = shutil.which(argv[0]) if argv else None
    if exe is None:
        return f"no C compiler ({cc} not found)"
    real = os.path.realpath(exe)
    st = os.stat(real)
    return [exe, *argv[1:]], f"{real}:{st.st_size}:{st.st_mtime_ns}:{' '.join(argv[1:])}"


def _key(identity: str, source: bytes) -> str:
    h = hashlib.sha256(source)
    h.update(f"|{identity}|{' '.join(FLAGS)}|{sys.platform}|{platform.machine()}|{ABI}".encode())
    return h.hexdigest()[:20]


def _build(argv: list[str], target: pathlib.Path) -> str | None:
    """Compile the kernel to ``target`` atomically; None on success, else the reason."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=target.parent)
    try:
        out = os.path.join(tmp, LIB_NAME)
        err = ""
        # function multi-versioning needs ifunc support and (for the level names) gcc >= 11
        for extra in ((), ("-DNBD_AVX2_ONLY",), ("-DNBD_NO_CLONES",)):
            cmd = [*argv, *FLAGS, *extra, "-o", out, str(SRC)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)
            except (OSError, subprocess.SubprocessError) as e:
                return f"compiler failed to run: {e}"
            if r.returncode == 0 and os.path.exists(out):
                os.replace(out, target)
                return None
            err = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[0]
        return f"build failed: {err}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bind(lib: ctypes.CDLL) -> None:
    i64, f64, vp = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
    lib.nbd_abi.restype = ctypes.c_int
    lib.nbd_abi.argtypes = []
    for name, args in (("nbd_stats", [vp, i64, i64, i64, i64, vp]), ("nbd_stats_sat", [vp, i64, i64, i64, i64, f64, f64, vp])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    lib.nbd_sq_norms.restype = None
    lib.nbd_sq_norms.argtypes = [vp, vp, i64, vp]
    lib.nbd_seg_norms.restype = None
    lib.nbd_seg_norms.argtypes = [vp, vp, vp, i64, vp, vp]
    lib.nbd_gather.restype = None
    lib.nbd_gather.argtypes = [vp, vp, i64, vp]


def _self_test(lib: ctypes.CDLL) -> bool:
    x = np.array([1.0, -2.0, 0.0, -0.0, 3.5, 0.5], np.float32)
    scratch = np.zeros(9 + 1)  # 9 fields, then the unit mask's bytes
    rc = lib.nbd_stats_sat(x.ctypes.data, 6, 3, 2, 2, 0.5, 3.0, scratch.ctypes.data)
    want = [6, 3.0, 1 + 4 + 12.25 + 0.25, -2.0, 3.5, 4, 0, 0, 5]
    return rc == 0 and scratch[:9].tolist() == want and scratch[9:].view(np.uint8)[:3].tolist() == [1, 0, 1]


def load() -> tuple[tuple[ctypes.CDLL, ctypes.PyDLL] | None, str]:
    """``((library, gil_held), status)``: the kernel built if needed and loaded twice (calls that
    release the GIL, for large tensors, and calls that keep it: ~0.1 µs less each), or None and the
    reason."""
    if os.environ.get("NBDEBUG_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled (NBDEBUG_NATIVE=0)"
    try:
        source = SRC.read_bytes()
    except OSError as e:
        return None, f"kernel source missing ({e})"
    cc = _compiler()
    if isinstance(cc, str):
        return None, cc
    argv, identity = cc
    key, why = _key(identity, source), "no cache directory"
    for root in _roots():
        target = root / key / LIB_NAME
        got = _open(target) if target.exists() else "not built"
        if isinstance(got, str):  # not built yet, or a bad file there (truncated, foreign): build it (again)
            try:
                why = _build(argv, target)
            except OSError as e:
                why = f"cannot write the cache ({e})"
                continue  # e.g. a read-only home: the private temporary directory next
            if why is not None:
                return None, why
            got = _open(target)
            if isinstance(got, str):
                return None, got
        return got, f"loaded {target}"
    return None, why


def _roots() -> Iterator[pathlib.Path]:
    """:func:`cache_dir`, then (unless ``NBDEBUG_CACHE_DIR`` is set) a private directory of this user
    in the system's temporary directory, used only if nobody else can write to it."""
    yield cache_dir()
    if not os.environ.get("NBDEBUG_CACHE_DIR") and hasattr(os, "getuid"):
        tmp = pathlib.Path(tempfile.gettempdir()) / f"nbdebug-native-{os.getuid()}"
        try:
            tmp.mkdir(mode=0o700, exist_ok=True)
            st = tmp.stat()
        except OSError:
            return
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            yield tmp


def _open(target: pathlib.Path) -> tuple[ctypes.CDLL, ctypes.PyDLL] | str:
    """The library at ``target`` loaded, bound and self-tested, or why not."""
    try:
        lib = ctypes.CDLL(str(target))
        _bind(lib)
        if lib.nbd_abi() != ABI or not _self_test(lib):
            return f"self-test failed ({target})"
        held = ctypes.PyDLL(str(target))  # the same library, calls that keep the GIL (small tensors)
        _bind(held)
    except (OSError, AttributeError) as e:
        return f"load failed: {e}"
    return lib, held
