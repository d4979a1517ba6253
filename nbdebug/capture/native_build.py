"""Compiling and loading the native statistics kernel (``_native/*.c``) for :mod:`.native`.

The sources are compiled with the system C compiler (``$CC`` or ``cc``; :data:`FLAGS`; on x86-64
Linux with gcc the hot loops are cloned for x86-64-v4/v3/baseline and picked at load time, never
``-march=native``) into one library, ``cache_dir()/<key>/libnbdstats.so``, where ``key`` hashes the
sources, the compiler (path, size, mtime, extra arguments), the flags and the platform: a changed
source or compiler builds a new library, an unchanged one is only loaded. The build runs in a
private temporary directory next to the target, is loaded and self-tested from there, and only then
moved in place with ``os.replace`` (atomic), so kernels or processes starting at once never load a
half-written file and a process never keeps a stale handle; the loser of a race just replaces the
file with an identical one. A library that fails the self-test is unloaded and built again. Only a
compiler error about the clones (``target_clones``, ``arch=``, ifunc) builds the next
:data:`VARIANTS` entry; any other failure (e.g. the compiler killed) caches nothing.

Next to the library, when Python's and numpy's headers are present (``sysconfig.get_paths()["include"]``,
``numpy.get_include()``; the key also hashes the Python version, ``EXT_SUFFIX`` and the numpy
version), the same sources plus ``pyext.c`` are built into the CPython module
``<key>/_nbdext<EXT_SUFFIX>`` (:func:`extension`: the library's clone variant, the same private
build directory, import and self-test, ``os.replace``). No headers, a failed build or a module that
fails its self-test leave the library's ctypes calls (the status says why) and cache nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from types import ModuleType

import numpy as np

NATIVE_DIR = pathlib.Path(__file__).with_name("_native")
SOURCES = ("stats.c", "norms.c")  # compiled into one library
EXT_SOURCE = "pyext.c"  # with SOURCES: the CPython module
HEADERS = ("nbd.h",)
ABI = 3  # nbd_abi() of a library this Python side can drive
# extra flags tried in turn, the next one only when the compiler rejects the clones of the previous:
# gcc < 11 has no x86-64-v3/v4 level names, some toolchains have no ifunc
VARIANTS = ((), ("-DNBD_AVX2_ONLY",), ("-DNBD_NO_CLONES",))
_CLONE_ERRORS = ("target_clones", "target_clone", "ifunc", "arch=", "x86-64-v", "avx2")
FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden")
LIB_NAME = "libnbdstats.so"
EXT_NAME = "_nbdext"  # the CPython module: _nbdext<EXT_SUFFIX> next to LIB_NAME
EXT_FLAGS = ("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ()  # Python's symbols come from the process


def _configured_dir() -> pathlib.Path:
    """``$NBDEBUG_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``, then ``nbdebug/native``;
    raises (RuntimeError, KeyError) when there is no home directory (HOME unset and no passwd entry)."""
    env = os.environ.get("NBDEBUG_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return root / "nbdebug" / "native"


def _private_tmp() -> pathlib.Path:
    """This user's private directory in the system's temporary directory."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return pathlib.Path(tempfile.gettempdir()) / f"nbdebug-native-{uid}"


def cache_dir() -> pathlib.Path:
    """Where compiled kernels live (one subdirectory per source/compiler/flags/platform key): the
    configured/home cache, or the private temporary directory when there is no home directory."""
    try:
        return _configured_dir()
    except (RuntimeError, KeyError, OSError):
        return _private_tmp()


def _sources() -> bytes:
    """Every source and header, in a fixed order (what the cache key hashes)."""
    return b"\0".join((NATIVE_DIR / name).read_bytes() for name in (*SOURCES, EXT_SOURCE, *HEADERS))


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
    h.update(f"|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}|{np.__version__}".encode())  # the CPython module's ABI
    return h.hexdigest()[:20]


def _build(argv: list[str], target: pathlib.Path) -> tuple[ctypes.CDLL, ctypes.PyDLL] | str:
    """Compile the kernel, load and self-test it from the temporary directory, then move it to
    ``target`` atomically: the loaded library, or the reason there is none (nothing written)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=target.parent)
    try:
        out = os.path.join(tmp, LIB_NAME)
        err = ""
        for extra in VARIANTS:
            cmd = [*argv, *FLAGS, *extra, "-I", str(NATIVE_DIR), "-o", out, *(str(NATIVE_DIR / f) for f in SOURCES)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)
            except (OSError, subprocess.SubprocessError) as e:
                return f"compiler failed to run: {e}"
            if r.returncode == 0 and os.path.exists(out):
                got = _open(pathlib.Path(out))
                if not isinstance(got, str):
                    os.replace(out, target)
                return got
            lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln.lower()] or r.stderr.strip().splitlines()
            err = lines[0] if lines else f"exit code {r.returncode}"
            if not any(k in r.stderr for k in _CLONE_ERRORS):
                break  # not about the clones (e.g. the compiler was killed): no lesser variant cached
        return f"build failed: {err}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bind(lib: ctypes.CDLL) -> None:
    i64, f64, vp = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
    lib.nbd_abi.restype = ctypes.c_int
    lib.nbd_abi.argtypes = []
    lib.nbd_variant.restype = ctypes.c_char_p
    lib.nbd_variant.argtypes = []
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
    """Every field on a known array (tail loop), and sums in double through the vector loop."""
    x = np.array([1.0, -2.0, 0.0, -0.0, 3.5, 0.5], np.float32)
    scratch = np.zeros(9 + 1)  # 9 fields, then the unit mask's bytes
    rc = lib.nbd_stats_sat(x.ctypes.data, 6, 3, 2, 2, 0.5, 3.0, scratch.ctypes.data)
    want = [6, 3.0, 1 + 4 + 12.25 + 0.25, -2.0, 3.5, 4, 0, 0, 5]
    ok = rc == 0 and scratch[:9].tolist() == want and scratch[9:].view(np.uint8)[:3].tolist() == [1, 0, 1]
    y = np.zeros(256, np.float32)
    y[[0, 128, 5]] = [1.0, -1.0, 1e-23]  # a float32 sum or square would lose the tiny value
    rc = lib.nbd_stats(y.ctypes.data, 256, 1, 256, 0, scratch.ctypes.data)
    tiny = float(np.float32(1e-23))
    return ok and rc == 0 and scratch[1] == tiny and scratch[2] == 2.0 + tiny * tiny and scratch[5] == 3


def variant(lib: ctypes.CDLL) -> str:
    """How the loaded library's hot loops were compiled (e.g. ``clones x86-64-v4/v3/default``)."""
    return lib.nbd_variant().decode()


def load() -> tuple[tuple[ctypes.CDLL, ctypes.PyDLL, ModuleType | None] | None, str]:
    """``((library, gil_held, module), status)``: the kernel built if needed and loaded twice (calls that
    release the GIL, for large tensors, and calls that keep it: ~0.1 µs less each), and the CPython
    module (None when it cannot be built or loaded: the status says why), or None and the reason."""
    if os.environ.get("NBDEBUG_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled (NBDEBUG_NATIVE=0)"
    try:
        source = _sources()
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
                got = _build(argv, target)
            except OSError as e:
                why = f"cannot write the cache ({e})"
                continue  # e.g. a read-only home: the private temporary directory next
            if isinstance(got, str):
                return None, got
        try:
            ext, note = extension(argv, got[0], target.parent)
        except Exception as e:  # anything at all (e.g. a cache that cannot be written any more): ctypes calls
            ext, note = None, f"{type(e).__name__}: {e}"
        note = "CPython entry points" if ext is not None else f"ctypes calls: {note}"
        return (*got, ext), f"loaded {target} ({variant(got[0])}; {note})"
    return None, why


def _roots() -> Iterator[pathlib.Path]:
    """The configured cache directory (if there is one), then (unless ``NBDEBUG_CACHE_DIR`` is set) a private directory of this user
    in the system's temporary directory, used only if nobody else can write to it."""
    try:
        configured: pathlib.Path | None = _configured_dir()
    except (RuntimeError, KeyError, OSError):  # no home directory (HOME unset, no passwd entry)
        configured = None
    if configured is not None:
        yield configured
    if not os.environ.get("NBDEBUG_CACHE_DIR") and hasattr(os, "getuid"):
        tmp = _private_tmp()
        try:
            tmp.mkdir(mode=0o700, exist_ok=True)
            st = tmp.stat()
        except OSError:
            return
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            yield tmp


def _open(target: pathlib.Path) -> tuple[ctypes.CDLL, ctypes.PyDLL] | str:
    """The library at ``target`` loaded, bound and self-tested, or why not (a library that fails is
    unloaded again, so that the same path can be loaded afresh once rebuilt)."""
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return f"load failed: {e}"
    try:
        _bind(lib)
        ok = lib.nbd_abi() == ABI and _self_test(lib)
    except AttributeError:  # a library of another version: a missing entry point
        ok = False
    if not ok:
        _unload(lib)
        return f"self-test failed ({target})"
    try:
        held = ctypes.PyDLL(str(target))  # the same library, calls that keep the GIL (small tensors)
        _bind(held)
    except (OSError, AttributeError) as e:
        return f"load failed: {e}"
    return lib, held


def _unload(lib: ctypes.CDLL) -> None:
    """dlclose a library nothing will call again (best effort)."""
    try:
        import _ctypes

        _ctypes.dlclose(lib._handle)  # type: ignore[attr-defined]
    except (ImportError, AttributeError, OSError):
        pass


# -- the CPython module (_nbdext): the same kernel called without ctypes ---------------------------

_EXTRA_OF = {"clones x86-64-v4/v3/default": (), "clones avx2/default": ("-DNBD_AVX2_ONLY",)}  # else NBD_NO_CLONES


def ext_path(folder: pathlib.Path) -> pathlib.Path:
    """Where the CPython module lives next to the library: ``_nbdext<EXT_SUFFIX>``."""
    return folder / (EXT_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def _ext_includes() -> list[str] | str:
    """``-I`` arguments for Python's and numpy's headers, or why there are none."""
    py = sysconfig.get_paths().get("include")
    if not py or not os.path.isfile(os.path.join(py, "Python.h")):
        return "no Python headers"
    npy = np.get_include()
    if not os.path.isfile(os.path.join(npy, "numpy", "arrayobject.h")):
        return "no numpy headers"
    return ["-I", py, "-I", npy]


def extension(argv: list[str], lib: ctypes.CDLL, folder: pathlib.Path) -> tuple[ModuleType | None, str]:
    """The CPython module next to the library ``lib`` (loaded from ``folder``), built like the library
    when missing or bad (same sources, flags and clone variant as ``lib``; private temporary directory,
    self-tested, then ``os.replace``): ``(module, "")``, or None and why (a failure caches nothing)."""
    target = ext_path(folder)
    if target.exists():
        got = _open_ext(target)
        if not isinstance(got, str):
            return got, ""
    inc = _ext_includes()
    if isinstance(inc, str):
        return None, inc
    extra = _EXTRA_OF.get(variant(lib), ("-DNBD_NO_CLONES",))
    tmp = tempfile.mkdtemp(prefix=".build-", dir=folder)
    try:
        out = os.path.join(tmp, target.name)
        cmd = [*argv, *FLAGS, *extra, *EXT_FLAGS, "-I", str(NATIVE_DIR), *inc, "-o", out,
               *(str(NATIVE_DIR / f) for f in (EXT_SOURCE, *SOURCES))]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"compiler failed to run: {e}"
        if r.returncode or not os.path.exists(out):
            lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln.lower()] or r.stderr.strip().splitlines()
            return None, f"build failed: {lines[0] if lines else f'exit code {r.returncode}'}"
        got = _open_ext(pathlib.Path(out))
        if isinstance(got, str):
            return None, got
        os.replace(out, target)
        return got, ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open_ext(path: pathlib.Path) -> ModuleType | str:
    """The CPython module at ``path`` imported and self-tested, or why not."""
    try:
        loader = importlib.machinery.ExtensionFileLoader(EXT_NAME, str(path))
        spec = importlib.util.spec_from_file_location(EXT_NAME, str(path), loader=loader)
        assert spec is not None
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        ok = mod.abi() == ABI and _self_test_ext(mod)
    except Exception as e:  # ImportError (a truncated or foreign file), a missing entry point
        return f"module not loaded ({type(e).__name__}: {e})"
    return mod if ok else f"module failed its self-test ({path})"


def _self_test_ext(mod: ModuleType) -> bool:
    """:func:`_self_test`'s arrays through the module's own result building (fresh row and mask)."""
    x = np.array([1.0, -2.0, 0.0, -0.0, 3.5, 0.5], np.float32)
    row, alive = mod.raw_stats(x.ctypes.data, 6, 3, 2, 2 | 1, 0.5, 3.0)
    ok = row.tolist() == [6, 3.0, 1 + 4 + 12.25 + 0.25, -2.0, 3.5, 4, 0, 0, 5] and alive.dtype == bool
    ok = ok and alive.tolist() == [True, False, True]
    y = np.zeros(256, np.float32)
    y[[0, 128, 5]] = [1.0, -1.0, 1e-23]
    row, alive = mod.raw_stats(y.ctypes.data, 256, 1, 256, 0, 0.0, 0.0)
    tiny = float(np.float32(1e-23))
    return ok and alive is None and row[1] == tiny and row[2] == 2.0 + tiny * tiny and row[5] == 3
