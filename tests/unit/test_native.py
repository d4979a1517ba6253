"""The fused native statistics kernel (nbdebug/capture/native.py + _native/*.c): the same fields
as the torch/numpy path (exact where the contract says identical, sums within 1e-6 of a float64
reference, also under cancellation), the dead-unit mask, threads, the helpers for the optimizer
watch, ZeroTensors (no memory), and every way of falling back (switch, no compiler, no home
directory, a stale or foreign library, a failed compile, tensors it does not handle), including two
processes building the kernel at once."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from nbdebug.capture import native, native_build
from nbdebug.capture.stats import IDX, stats_and_units, tensor_stats, unit_alive

EXACT = [IDX[f] for f in ("numel", "min", "max", "nonzero", "nan", "inf", "extra")]
REPO = Path(__file__).resolve().parents[2]
ENV_OFF = os.environ.get("NBDEBUG_NATIVE", "1") == "0"
HAVE_EXT = not isinstance(native_build._ext_includes(), str)  # Python's and numpy's headers: the CPython module is built


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    native._reset()
    yield
    native._reset()


@contextmanager
def fallback() -> Iterator[None]:
    """The torch/numpy path (NBDEBUG_NATIVE=0), restored afterwards."""
    saved = os.environ.get("NBDEBUG_NATIVE")
    os.environ["NBDEBUG_NATIVE"] = "0"
    native._reset()
    try:
        assert not native.available()
        yield
    finally:
        if saved is None:
            del os.environ["NBDEBUG_NATIVE"]
        else:
            os.environ["NBDEBUG_NATIVE"] = saved
        native._reset()


def _cancel() -> torch.Tensor:
    """1 + 7 x 3e-8 - 1 in one lane's block (a float32 block sum gives 0, the reference 2.1e-7)."""
    v = torch.zeros(128)
    v[0::16] = torch.tensor([1.0] + [3e-8] * 7)
    v[1] = -1.0
    return v


def _inf_and_overflow() -> torch.Tensor:
    """Finite values whose float32 lane sum overflows, and a -Inf: the sum is -Inf (not NaN)."""
    x = torch.zeros(128)
    x[0] = x[16] = 3e38
    x[32] = -math.inf
    return x


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    nan, inf = math.nan, math.inf
    out: dict[str, torch.Tensor] = {
        "0-d": torch.tensor(-2.5),
        "one": torch.tensor([3.0]),
        "empty": torch.zeros(0, 4),
        "odd": r(1237),
        "above-numpy-max": r((1 << 16) + 7),
        "signed-zeros": torch.tensor([0.0, -0.0, 1.0, -0.0, -3.0, 0.0, 2.0]),
        "only-neg-zero": torch.full((37,), -0.0),
        "nan": torch.tensor([1.0, nan, -2.0, 0.0] * 50),
        "all-nan": torch.full((19,), nan),
        "inf": torch.tensor([1.0, inf, -inf, 0.0, -0.0] * 40),
        "nan-and-inf": torch.cat([r(300), torch.tensor([nan, inf, -inf, nan])]),
        "all-negative": -r(500).abs() - 0.1,
        "all-positive": r(500).abs() + 0.1,
        "relu": r(64, 33).relu(),
        "NxC": r(50, 9),
        "NxCxHxW": r(4, 6, 7, 5).relu(),
        "big-maps": r(3, 4, 20, 20).relu(),  # inner >= 256: units per segment
        "channels-last": r(4, 6, 7, 5).relu().contiguous(memory_format=torch.channels_last),
        "transposed": r(30, 20).relu().t(),
        "permuted-3d": r(5, 6, 7).relu().permute(2, 0, 1),
        "huge": torch.full((300,), 3e38),  # float32 block sums overflow, the values do not
        "huge-mixed": torch.tensor([3e38, -3e38, 1e30] * 100),
        "tanh": torch.tanh(3 * r(8, 40)),
        "sigmoid": torch.sigmoid(8 * r(8, 40)),
        # zero mean: the sum is tiny next to sum(|x|) (checked relative to the reference itself)
        "layernorm": torch.nn.functional.layer_norm(r(16, 4096), (4096,)),
        "cancel": _cancel(),
        "tiny": torch.full((1000,), 1e-20),  # squares below float32's normal range
        "tinier": torch.full((300,), 1e-23),  # squares below float32's subnormals: 0 in float32
        "inf-and-overflow": _inf_and_overflow(),
    }
    dead = r(8, 5, 6, 6).relu()
    dead[:, 1] = 0.0
    dead[:, 3] = -0.0
    dead[2, 4] = nan
    dead[:, 4] = 0.0
    dead[5, 4, 3, 3] = nan  # NaN is not zero: unit 4 alive
    out["dead-units"] = dead
    big_dead = r(2, 3, 16, 20).relu()
    big_dead[:, 0] = 0.0
    out["dead-units-big-maps"] = big_dead
    out["dead-units-channels-last"] = dead.nan_to_num().contiguous(memory_format=torch.channels_last)
    lin = r(40, 12).relu()
    lin[:, [0, 7]] = 0.0
    out["dead-columns"] = lin
    out["one-unit"] = torch.tensor([[0.0], [0.0], [2.0]])
    return out


CASES = _cases()
SATURATIONS = [None, (-1.0, 1.0), (0.0, 1.0)]


def _reference_sums(t: torch.Tensor) -> tuple[float, float, float]:
    x = t.detach().double().reshape(-1)
    return float(x.sum()), float((x * x).sum()), float(x.abs().sum())


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _check_row(row: np.ndarray, want: np.ndarray, t: torch.Tensor, native_row: bool = True) -> None:
    """EXACT fields equal to ``want``'s; sums against the float64 reference.

    A native row's sum must be within 1e-6 of |reference| plus 1e-12 of sum(|x|): the second term is
    the worst case of summing in double lanes (~2^11 values a lane here, x 1.1e-16), a millionth of
    what float32 blocks give (the old bound, 1e-6 sum(|x|), let a layer-norm output's sum be 2.5%
    off). Its sum of squares (all terms >= 0, squared in double) within 1e-10 relative: float32
    squares lose ~1e-7, tiny ones underflow. ``native_row=False`` (the torch path): the contract's
    1e-6 of sum(|x|)."""
    for i in EXACT:
        assert _same(float(row[i]), float(want[i])), (i, row, want)
    s, ss, sabs = _reference_sums(t)
    if math.isfinite(s) and math.isfinite(ss):
        if native_row:
            assert abs(row[IDX["sum"]] - s) <= 1e-6 * abs(s) + 1e-12 * sabs, (row[IDX["sum"]], s)
            assert abs(row[IDX["sumsq"]] - ss) <= 1e-10 * ss, (row[IDX["sumsq"]], ss)
        else:
            assert abs(row[IDX["sum"]] - s) <= 1e-6 * sabs
            assert abs(row[IDX["sumsq"]] - ss) <= 1e-6 * ss
    else:  # NaN/Inf: the same non-finite sums as the float64 reference
        assert _same(float(row[IDX["sum"]]), s) and _same(float(row[IDX["sumsq"]]), ss), (row, s, ss)


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_kernel_is_built_and_used_here() -> None:
    assert native.available(), native.status()
    assert native.status().startswith("loaded ") and native.status().endswith(")")  # (the variant)
    lib = Path(native.status().removeprefix("loaded ").rsplit(" (", 1)[0])
    assert lib.is_file() and REPO not in lib.parents  # a test run never writes into the repo
    assert native.stats(torch.ones(3)) is not None


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("sat", SATURATIONS)
def test_same_fields_as_fallback_and_reference(name: str, sat: tuple[float, float] | None) -> None:
    t = CASES[name]
    assert native.stats(t, sat, units=True) is not None  # these all take the native path
    got = stats_and_units(t, saturation=sat, units=True)
    raw = tensor_stats(t, saturation=sat)
    mask = unit_alive(t) if t.dim() >= 2 else None
    with fallback():
        want = stats_and_units(t, saturation=sat, units=True)
        want_raw = tensor_stats(t, saturation=sat)
        want_mask = unit_alive(t) if t.dim() >= 2 else None
    _check_row(got[0], want[0], t)
    _check_row(raw, want_raw, t)
    assert np.array_equal(got[0], raw, equal_nan=True)
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1].dtype == bool and got[1].tolist() == np.asarray(want[1]).tolist()
    if want_mask is None:
        assert mask is None
    else:
        assert np.asarray(mask).tolist() == np.asarray(want_mask).tolist()


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_no_torch_op_on_the_native_path() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(32, 16, 8, 8).relu()
    with Ops() as spy:
        tensor_stats(x[:, :3])  # not dense: the torch path (the spy sees its ops)
    assert spy.ops
    with Ops() as spy:
        stats_and_units(x, saturation=(0.0, 1.0), units=True)  # one native pass: no torch op at all
        tensor_stats(x)
    assert spy.ops == []


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_hand_values_and_mask() -> None:
    t = torch.zeros(3, 4, 2)
    t[0, 0, 1] = 2.0
    t[2, 2, 0] = -3.0
    t[1, 3, 1] = -0.0
    t[1, 1, 0] = math.nan
    row, alive = native.stats(t, units=True)
    assert row[IDX["numel"]] == 24 and row[IDX["nonzero"]] == 3 and row[IDX["nan"]] == 1
    assert math.isnan(row[IDX["min"]]) and math.isnan(row[IDX["max"]])  # like aminmax
    assert alive.tolist() == [True, True, True, False]
    assert native.stats(torch.ones(2, 3), units=True)[1] is None  # no zero: every unit alive
    assert native.stats(torch.zeros(2, 3), units=False)[1] is None


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_saturation_bounds_compare_in_float32() -> None:
    lo, hi = float(np.float32(0.0 + 1e-3)), float(np.float32(1.0 - 1e-3))
    up = lambda v: float(np.nextafter(np.float32(v), np.float32(2)))  # noqa: E731
    down = lambda v: float(np.nextafter(np.float32(v), np.float32(-2)))  # noqa: E731
    vals = [lo, up(lo), down(lo), hi, up(hi), down(hi), 0.0, 1.0, 0.5, math.nan]
    t = torch.tensor(vals * 3)
    row, _ = native.stats(t, (0.0, 1.0))
    assert row[IDX["extra"]] == 3 * 6  # lo, below lo, 0.0 and hi, above hi, 1.0 (not above lo, below hi, 0.5, NaN)
    with fallback():
        assert tensor_stats(t, saturation=(0.0, 1.0))[IDX["extra"]] == row[IDX["extra"]]


def _big_cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    maps = torch.randn(16, 8, 32, 32, generator=g).relu()
    maps[:, 5] = 0.0
    cols = torch.randn(4096, 40, generator=g).relu()
    cols[:, [3, 39]] = 0.0
    cols[100, 39] = math.nan
    flat = torch.randn(300_001, generator=g)
    flat[[7, 200_000]] = torch.tensor([math.inf, -math.inf])
    return {"maps": maps, "maps-channels-last": maps.contiguous(memory_format=torch.channels_last),
            "columns": cols, "flat": flat, "odd": CASES["odd"]}


BIG = _big_cases()


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
@pytest.mark.parametrize("name", list(BIG))
def test_threads_split_gives_the_same_fields(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = BIG[name]
    one = native.stats(t, (-1.0, 1.0), units=True)
    monkeypatch.setattr(native, "MIN_PER_THREAD", 5000)  # parts of >= 1 chunk (4096 elements) each
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        many = native.stats(t, (-1.0, 1.0), units=True)
    finally:
        torch.set_num_threads(before)
    _check_row(many[0], one[0], t)
    assert (many[1] is None) == (one[1] is None)
    if one[1] is not None:
        assert many[1].tolist() == one[1].tolist()
    with fallback():
        want = stats_and_units(t, saturation=(-1.0, 1.0), units=True)
    _check_row(many[0], want[0], t)
    assert (want[1] is None) == (one[1] is None)
    if want[1] is not None:
        assert many[1].tolist() == want[1].tolist() and not all(want[1])


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_tensors_it_does_not_take() -> None:
    class Sub(torch.Tensor):
        pass

    base = torch.randn(6, 8)
    for t in (base.double(), base.half(), base[:, ::2], torch.randn(3, 1).expand(3, 4), base.as_subclass(Sub),
              torch.arange(6)):
        assert native.stats(t) is None
    with fallback():
        want = tensor_stats(base[:, ::2])
    _check_row(tensor_stats(base[:, ::2]), want, base[:, ::2], native_row=False)
    with torch.inference_mode():  # inference tensors are fine
        inf_t = torch.randn(5, 7).relu()
    row = native.stats(inf_t, units=True)[0]
    with fallback():
        _check_row(row, tensor_stats(inf_t), inf_t)
    p = nn.Parameter(torch.randn(4, 4))
    assert native.stats(p) is not None


def test_off_switch_and_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.tensor([[1.0, -0.0], [0.0, 3.0]])
    monkeypatch.setenv("NBDEBUG_NATIVE", "0")
    native._reset()
    assert not native.available() and "NBDEBUG_NATIVE=0" in native.status()
    monkeypatch.setenv("NBDEBUG_NATIVE", "1")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("NBDEBUG_CACHE_DIR", str(tmp_path))
    native._reset()
    assert not native.available()
    assert "not found" in native.status()
    assert native.stats(t) is None and native.sq_norms([t]) is None and native.seg_norms(np.zeros(4, np.float32), [t]) is None
    raw, alive = stats_and_units(t, units=True)  # the torch/numpy path, same answers
    assert raw.tolist() == [4, 4.0, 10.0, 0.0, 3.0, 2, 0, 0, 0]
    assert alive.tolist() == [True, True]
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("CC", sys.executable + " -c 'import sys; sys.exit(1)'")  # a compiler that fails
    native._reset()
    assert not native.available() and native.status().startswith("build failed")


@pytest.fixture
def quick_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Libraries built into a test's own cache compile at -O0 without the x86-64-v4/v3 clones (~0.5
    instead of ~3 CPU-s each): these tests check where a library goes and when it is built again,
    not its speed; the session's own build (the kernel every other test uses) keeps FLAGS and VARIANTS."""
    monkeypatch.setattr(native_build, "FLAGS", QUICK_FLAGS)
    monkeypatch.setattr(native_build, "VARIANTS", QUICK_VARIANTS)


QUICK_FLAGS = ("-O0", *native_build.FLAGS[1:])
QUICK_VARIANTS = (("-DNBD_NO_CLONES",),)


def _cache_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path]:
    """With the cache in ``tmp_path``: the compiler's argv and the path (its folder made) where the
    library for this compiler and these sources is looked up."""
    monkeypatch.setenv("NBDEBUG_CACHE_DIR", str(tmp_path))
    argv, identity = native_build._compiler()  # type: ignore[misc]
    target = tmp_path / native_build._key(identity, native_build._sources()) / native_build.LIB_NAME
    target.parent.mkdir(parents=True)
    return argv, target


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_a_bad_library_in_the_cache_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    _argv, target = _cache_target(tmp_path, monkeypatch)
    target.write_bytes(b"\x7fELF truncated")  # e.g. a copy interrupted half way
    native._reset()
    assert native.available(), native.status()
    assert native.status().startswith(f"loaded {target} (") and target.stat().st_size > 1000


@pytest.mark.skipif(ENV_OFF or not hasattr(os, "getuid"), reason="NBDEBUG_NATIVE=0 in the environment / no uid")
def test_unwritable_cache_falls_back_to_a_private_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    import tempfile

    (tmp_path / "file").write_text("not a directory")
    monkeypatch.delenv("NBDEBUG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))  # cannot be created
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    native._reset()
    assert native.available(), native.status()
    private = tmp_path / "tmp" / f"nbdebug-native-{os.getuid()}"
    assert native.status().startswith(f"loaded {private}/") and (private.stat().st_mode & 0o777) == 0o700


_CHILD = """
import os, sys, time, torch
from nbdebug.capture import native, native_build
native_build.FLAGS, native_build.VARIANTS = %s, %s  # quick_builds' settings
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):  # start building together
    time.sleep(0.005)
ok = native.available()
row, alive = native.stats(torch.tensor([[0.0, 2.0], [0.0, -1.0]]), units=True)
print(ok, native.status(), row.tolist(), alive.tolist())
"""


@pytest.mark.slow
@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_two_processes_build_at_once(tmp_path: Path) -> None:
    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "NBDEBUG_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    child = _CHILD % (QUICK_FLAGS, QUICK_VARIANTS)
    procs = [subprocess.Popen([sys.executable, "-c", child, str(sync / str(i)), str(sync / "go")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.monotonic() + 120
    while not all((sync / f"{i}.ready").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("True loaded "), out
        assert out.rstrip().endswith("[4.0, 1.0, 5.0, -1.0, 2.0, 2.0, 0.0, 0.0, 0.0] [False, True]")
    libs = sorted(str(f.relative_to(cache)) for f in cache.rglob("*") if f.is_file())
    want = [native_build.LIB_NAME] + ([native_build.ext_path(Path()).name] if HAVE_EXT else [])
    assert sorted(Path(f).name for f in libs) == sorted(want)  # one library (and module), no temporary left over
    assert len({Path(f).parent for f in libs}) == 1
    assert [d.name for d in cache.rglob(".build-*")] == []


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_threads_calling_at_once_get_their_own_results() -> None:
    tensors = [torch.full((i + 1, 3), float(i)) for i in range(8)]
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(300):
            for i in range(k, 8, 2):
                row, _ = native.stats(tensors[i])
                if row[IDX["numel"]] != 3 * (i + 1) or row[IDX["max"]] != i:
                    errors.append(f"{i}: {row}")

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    work(0)
    for th in threads:
        th.join()
    assert errors == []


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_sq_norms_seg_norms_gather() -> None:
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=g) for s in [(10, 5), (5,), (300, 7), (1,), (129,)]]
    ref = [float((p.double() ** 2).sum()) for p in params]
    got = native.sq_norms(params)
    assert got.dtype == np.float64 and np.allclose(got, ref, rtol=1e-6, atol=0)
    big = native.sq_norms([torch.full((200,), 1e20), torch.tensor([math.inf, 1.0])])
    assert big[0] == pytest.approx(200 * float(np.float32(1e20)) ** 2, rel=1e-12) and big[1] == math.inf
    assert native.sq_norms([]).shape == (0,)
    assert native.sq_norms([params[0].double()]) is None and native.sq_norms([params[0].t()]) is None
    buf = np.empty(sum(p.numel() for p in params), np.float32)
    assert native.gather(params, buf)
    assert np.array_equal(buf, np.concatenate([p.numpy().ravel() for p in params]))
    snapshot = buf.copy()
    with torch.no_grad():
        for i, p in enumerate(params):
            p.mul_(0.5).add_(i)
    before, diff = native.seg_norms(buf, params)
    assert np.array_equal(buf, snapshot)  # not modified
    pos = 0
    for i, p in enumerate(params):
        b = snapshot[pos : pos + p.numel()]
        pos += p.numel()
        d = np.subtract(b, p.numpy().ravel()).astype(np.float64)
        assert before[i] == pytest.approx(float((b.astype(np.float64) ** 2).sum()), rel=1e-6)
        assert diff[i] == pytest.approx(float((d**2).sum()), rel=1e-6)
    with pytest.raises(ValueError):
        native.seg_norms(buf[:-1], params)


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_seg_plan_equals_seg_norms_at_every_call() -> None:
    """A packed plan reads the parameters as they are when it runs (not when it was built) and gives
    fresh arrays each time; None where seg_norms is None."""
    g = torch.Generator().manual_seed(4)
    params = [torch.randn(s, generator=g) for s in [(6, 3), (3,), (257,)]]
    buf = np.empty(sum(p.numel() for p in params), np.float32)
    assert native.gather(params, buf)
    run = native.seg_plan(buf, params)
    assert run is not None
    first = run()
    for step in range(3):
        with torch.no_grad():
            for i, p in enumerate(params):
                p.mul_(0.9).add_(0.01 * (i + step))
        got, want = run(), native.seg_norms(buf, params)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert first[1].sum() == 0.0 and got[1].sum() > 0  # earlier results are not overwritten
    assert native.seg_plan(buf, [params[0].double()]) is None
    assert native.seg_plan(np.empty(0, np.float32), []) is None
    with pytest.raises(ValueError):
        native.seg_plan(buf[:-1], params)


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_capture_rows_equal_with_and_without_kernel() -> None:
    from nbdebug.capture.session import Capture
    from nbdebug.capture.stats import FIELDS

    def run() -> dict[str, dict[str, float]]:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 12 * 12, 10))
        with torch.no_grad():
            m[0].weight[2] = 0.0
            m[0].bias[2] = -1.0  # a dead channel after the ReLU
        x = torch.randn(5, 3, 16, 16)
        with Capture(m) as cap:
            m(x).sum().backward()
        return {r.name: {**r.stats, **{f"grad_{k}": v for k, v in (r.grad or {}).items()}} for r in cap.result.layers}

    got = run()
    with fallback():
        want = run()
    assert got.keys() == want.keys() and len(FIELDS) == 9
    assert got["1"]["dead_unit_frac"] == 1 / 8  # the dead channel, found by the kernel's unit mask
    for name in want:
        for key, w in want[name].items():
            v = got[name][key]
            if key.removeprefix("grad_") in ("mean", "std", "norm"):
                assert v == pytest.approx(w, rel=1e-5, abs=1e-9), (name, key)
            else:
                assert np.array_equal(np.asarray(v), np.asarray(w), equal_nan=True), (name, key, v, w)


def _paths(kernel: bool) -> Iterator[None]:
    """The kernel path (skipped when the environment turns it off) or the torch/numpy path."""
    if kernel and ENV_OFF:
        pytest.skip("NBDEBUG_NATIVE=0 in the environment")
    return fallback() if not kernel else _loaded()


@contextmanager
def _loaded() -> Iterator[None]:
    assert native.available(), native.status()
    yield


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "fallback"])
def test_zero_tensor_stats_read_no_memory(kernel: bool) -> None:
    z = torch._efficientzerotensor((3, 4, 2))  # what torch.sgn's backward gives: no memory at all
    assert z.data_ptr() == 0 and z._is_zerotensor()
    dense = torch.zeros(3, 4, 2)
    with _paths(kernel):
        for sat in SATURATIONS:
            raw, alive = stats_and_units(z, saturation=sat, units=True)
            want, want_alive = stats_and_units(dense, saturation=sat, units=True)
            assert raw.tolist() == want.tolist() and alive.tolist() == want_alive.tolist() == [False] * 4
            assert tensor_stats(z, saturation=sat).tolist() == want.tolist()
        assert raw.tolist() == [24, 0, 0, 0, 0, 0, 0, 0, 24]  # (0, 1): every zero <= 0 + 1e-3
        assert np.asarray(unit_alive(z)).tolist() == [False] * 4
        if kernel:
            assert native.sq_norms([z, torch.ones(3)]).tolist() == [0.0, 3.0]
            assert native.seg_norms(np.zeros(24, np.float32), [z]) is None  # nothing to read: the caller's path
            assert native.gather([z], np.zeros(24, np.float32)) is False


class _Sgn(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sgn(x) + x.detach()  # the Linear's output gradient is a ZeroTensor


class _SgnScale(nn.Module):  # straight-through style: the parameter reaches the loss only through sgn
    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.ones(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sgn(self.s)  # s.grad is a ZeroTensor


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "fallback"])
def test_capture_of_zero_tensor_gradients(kernel: bool) -> None:
    from nbdebug.capture.session import Capture

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), _Sgn())
    x = torch.randn(3, 4)
    with _paths(kernel):
        with Capture(m) as cap:
            m(x).sum().backward()
    grads = {r.name: r.grad for r in cap.result.layers}
    zero = {"numel": 15.0, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "zero_frac": 1.0, "nan": 0.0, "inf": 0.0,
            "extra_frac": 0.0, "norm": 0.0}
    assert grads["0"] == zero
    assert grads["1"] == {**zero, "mean": 1.0, "min": 1.0, "max": 1.0, "zero_frac": 0.0, "norm": math.sqrt(15)}


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "fallback"])
def test_training_loop_with_a_zero_tensor_parameter_gradient(kernel: bool) -> None:
    from nbdebug.capture.session import Capture

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), _SgnScale())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with _paths(kernel), Capture(m) as cap:  # the user's loop runs
        for _ in range(2):
            opt.zero_grad()
            m(torch.randn(3, 4)).sum().backward()
            opt.step()
    assert m[1].s.grad._is_zerotensor()
    rows = {r.name: r for r in cap.result.layers}
    assert rows["1"].param_grad_norm == 0.0
    w, b = (p.grad.double() for p in m[0].parameters())
    assert rows["0"].param_grad_norm == pytest.approx(math.sqrt(float((w * w).sum() + (b * b).sum())), rel=1e-6)
    assert rows["1"].grad == {"numel": 30.0, "mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "zero_frac": 0.0,
                              "nan": 0.0, "inf": 0.0, "extra_frac": 0.0, "norm": math.sqrt(30)}


def test_errors_while_loading_never_reach_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbdebug.capture.session import Capture

    calls = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(native_build, "load", broken)
    native._reset()
    m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    for _ in range(2):
        with Capture(m) as cap:
            m(torch.randn(2, 4)).sum().backward()
        assert cap.result.layers[0].stats["numel"] == 6
    assert not native.available() and native.sq_norms([torch.ones(2)]) is None
    assert native.status() == "kernel unavailable (RuntimeError: Could not determine home directory.)"
    assert calls == [1]  # tried once, not per hook call


@pytest.mark.skipif(ENV_OFF or not hasattr(os, "getuid"), reason="NBDEBUG_NATIVE=0 in the environment / no uid")
def test_no_home_directory_uses_the_private_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    import pwd
    import tempfile

    for var in ("HOME", "XDG_CACHE_HOME", "NBDEBUG_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)

    def no_entry(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)  # a container user without a passwd entry
    with pytest.raises(RuntimeError):
        Path.home()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"nbdebug-native-{os.getuid()}"
    assert native_build.cache_dir() == private
    native._reset()
    assert native.available(), native.status()
    assert native.status().startswith(f"loaded {private}/")


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_a_foreign_library_is_rebuilt_and_the_new_one_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    argv, target = _cache_target(tmp_path, monkeypatch)
    old = tmp_path / "old.c"  # a valid library of another ABI under the key's path (loads, fails the self-test)
    old.write_text((native_build.NATIVE_DIR / "stats.c").read_text().replace(f"#define NBD_ABI {native_build.ABI}", "#define NBD_ABI 1"))
    subprocess.run([*argv, *native_build.FLAGS, "-DNBD_NO_CLONES", "-I", str(native_build.NATIVE_DIR), "-o", str(target),
                    str(old), str(native_build.NATIVE_DIR / "norms.c")], check=True)
    for _ in range(2):  # the process does not keep the stale handle, also when loading again
        native._reset()
        assert native.available(), native.status()
        assert native.status().startswith(f"loaded {target} (")
        assert native.stats(torch.tensor([1.0, -0.0, 2.0]))[0].tolist() == [3, 3.0, 5.0, 1.0 * -0.0, 2.0, 2, 0, 0, 0]


def _fake_cc(tmp_path: Path, script: str, name: str, real: str) -> str:
    """A compiler script running ``script`` with $REAL the real compiler."""
    cc = tmp_path / name
    cc.write_text(f"#!/bin/sh\nREAL='{real}'\n{script}\n")
    cc.chmod(0o755)
    return str(cc)


@pytest.mark.skipif(ENV_OFF or sys.platform == "win32", reason="NBDEBUG_NATIVE=0 in the environment / no sh")
def test_only_a_clones_error_builds_the_lesser_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.environ.get("CC") or "cc"
    monkeypatch.setenv("NBDEBUG_CACHE_DIR", str(tmp_path / "cache"))
    # the first compile killed (out of memory), the others would work: nothing is cached
    monkeypatch.setenv("CC", _fake_cc(tmp_path, 'case "$*" in *-DNBD_*) exec $REAL "$@";; esac\n'
                                                'echo "cc: fatal error: Killed signal terminated program cc1" >&2; exit 1', "killed-cc", real))
    native._reset()
    assert not native.available()
    assert native.status() == "build failed: cc: fatal error: Killed signal terminated program cc1"
    assert not [f for f in (tmp_path / "cache").rglob("*.so")]
    # a compiler that rejects the clones: the no-clones build, named in the status
    monkeypatch.setenv("CC", _fake_cc(tmp_path, 'case "$*" in *-DNBD_NO_CLONES*) exec $REAL "$@";; esac\n'
                                                "echo \"stats.c:40:1: error: the call requires 'ifunc', which is not supported\" >&2; exit 1", "no-ifunc-cc", real))
    native._reset()
    assert native.available(), native.status()
    assert "(no clones; " in native.status()
    if HAVE_EXT:  # the module is built with the library's variant
        assert native.status().endswith("(no clones; CPython entry points)") and native._fast_stats is not None


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_tiny_values_and_inf_sums() -> None:
    for v in (1e-20, 1e-23, 1e-40):  # squares below float32's normal range, below its subnormals; a subnormal
        t = torch.full((1000,), v)
        want = 1000 * float(np.float32(v)) ** 2
        assert native.stats(t)[0][IDX["sumsq"]] == pytest.approx(want, rel=1e-12) and want > 0
        assert native.sq_norms([t])[0] == pytest.approx(want, rel=1e-12)
    row = native.stats(_inf_and_overflow())[0]
    assert row[IDX["sum"]] == -math.inf and row[IDX["sumsq"]] == math.inf and row[IDX["inf"]] == 1


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_no_memory_kept_after_use() -> None:
    import gc
    import weakref

    params = [torch.randn(300, 7), torch.randn(5)]
    buf = np.empty(2105, np.float32)
    assert native.gather(params, buf) and native.seg_norms(buf, params) is not None
    gone = weakref.ref(buf)
    del buf
    gc.collect()
    assert gone() is None  # the address cache does not keep a snapshot buffer alive
    native.stats(torch.randn(2, 50_000))  # no unit mask asked: the scratch does not grow for 50k units
    assert native._own[1].size <= 1024
    native.stats(torch.randn(2, 50_000), units=True)  # the ctypes path (GIL_MAX elements or more)
    assert native._own[1].size >= 50_000


def test_tiny_values_on_the_torch_numpy_path() -> None:
    """The BLAS dots of the fallback keep tiny squares (the native kernel must match them)."""
    with fallback():
        for n in (1000, (1 << 16) + 5):  # numpy, then torch's reductions
            t = torch.full((n,), 1e-23)
            want = n * float(np.float32(1e-23)) ** 2
            assert tensor_stats(t)[IDX["sumsq"]] == pytest.approx(want, rel=1e-6) and want > 0


# -- the CPython module (_nbdext): the same answers as the ctypes calls, and every way without it --

needs_ext = pytest.mark.skipif(ENV_OFF or not HAVE_EXT, reason="NBDEBUG_NATIVE=0 in the environment / no Python or numpy headers")


@contextmanager
def _ctypes_only() -> Iterator[None]:
    """The ctypes calls (the module's entry points set aside), restored afterwards."""
    assert native.available(), native.status()
    saved = native._fast_stats, native._fast_sq, native._fast_seg
    native._fast_stats = native._fast_sq = native._fast_seg = None
    try:
        yield
    finally:
        native._fast_stats, native._fast_sq, native._fast_seg = saved


def _identical(got: tuple[np.ndarray, np.ndarray | None] | None, want: tuple[np.ndarray, np.ndarray | None] | None) -> None:
    """The same row bit for bit (NaN, -0.0) and the same mask (or both None)."""
    if got is None or want is None:
        assert got is want
        return
    assert got[0].dtype == want[0].dtype == np.float64 and got[0].shape == (9,)
    assert got[0].tobytes() == want[0].tobytes(), (got[0], want[0])
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1].dtype == want[1].dtype == bool and got[1].tobytes() == want[1].tobytes()  # bytes 0/1 only


@needs_ext
def test_the_module_is_built_and_used_here() -> None:
    assert native.available() and native.status().endswith("; CPython entry points)"), native.status()
    lib = Path(native.status().removeprefix("loaded ").rsplit(" (", 1)[0])
    assert native_build.ext_path(lib.parent).is_file() and native._fast_stats is not None


@needs_ext
@pytest.mark.parametrize("sat", [*SATURATIONS, [0.0, 1.0], (np.float32(-1.0), 1.0), (0, 1)], ids=str)
def test_module_and_ctypes_give_identical_results(sat: object) -> None:
    class Sub(torch.Tensor):
        pass

    base = torch.randn(6, 8)
    with torch.inference_mode():
        inf_t = torch.randn(5, 7).relu()
    others = [torch._efficientzerotensor((3, 4, 2)), base.double(), base[:, ::2], base.as_subclass(Sub), torch.arange(6),
              nn.Parameter(torch.randn(4, 4)), inf_t, torch.randn(2, 40_000).relu(), torch.zeros(3, 5000)]
    for t in [*CASES.values(), *BIG.values(), *others]:
        for units in (False, True):
            got = native.stats(t, sat, 1e-3, units)  # type: ignore[arg-type]
            with _ctypes_only():
                want = native.stats(t, sat, 1e-3, units)  # type: ignore[arg-type]
            _identical(got, want)
            again = native.stats(t, sat, 1e-3, units)  # type: ignore[arg-type]
            if got is not None:  # fresh arrays each call
                assert again[0] is not got[0] and (got[1] is None or again[1] is not got[1])


@needs_ext
def test_module_sq_norms_and_seg_plan_equal_the_ctypes_calls() -> None:
    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(s, generator=g) for s in [(10, 5), (5,), (300, 7), (1,), (129,), (70_000,)]]
    z = torch._efficientzerotensor((3,))
    groups = [ts, [z, *ts], [], [ts[0].double()], [ts[0].t()], [*ts, torch.randn(3, 3)[:, :2]], tuple(ts), [nn.Parameter(ts[2])]]
    for group in groups:
        got = native.sq_norms(group)
        with _ctypes_only():
            want = native.sq_norms(group)
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == np.float64 and got.tobytes() == want.tobytes()
    buf = np.empty(sum(t.numel() for t in ts), np.float32)
    assert native.gather(ts, buf)
    run = native.seg_plan(buf, ts)
    with _ctypes_only():
        slow = native.seg_plan(buf, ts)
    first = run()
    with torch.no_grad():
        for i, t in enumerate(ts):
            t.mul_(0.5).add_(i)
    for a, b in zip(run(), slow()):
        assert a.dtype == np.float64 and a.tobytes() == b.tobytes()
    assert first[1].sum() == 0.0  # not overwritten by the later call


def test_without_python_headers_the_ctypes_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    if ENV_OFF:
        pytest.skip("NBDEBUG_NATIVE=0 in the environment")
    monkeypatch.setenv("NBDEBUG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_build, "_ext_includes", lambda: "no Python headers")
    native._reset()
    assert native.available() and native.status().endswith("; ctypes calls: no Python headers)"), native.status()
    assert native._fast_stats is None and native._fast_sq is None and native._fast_seg is None
    t = CASES["dead-units"]
    row, alive = native.stats(t, (0.0, 1.0), units=True)
    assert not list(tmp_path.rglob(native_build.EXT_NAME + "*"))
    # headers that do not compile: nothing cached, the ctypes calls
    monkeypatch.setattr(native_build, "_ext_includes", lambda: ["-I", str(tmp_path / "nowhere"), "-DNBD_MISSING_HEADERS"])
    native._reset()
    assert native.available() and "; ctypes calls: build failed: " in native.status(), native.status()
    assert not list(tmp_path.rglob(native_build.EXT_NAME + "*")) and not list(tmp_path.rglob(".build-*"))
    _identical(native.stats(t, (0.0, 1.0), units=True), (row, alive))
    if HAVE_EXT:  # headers again: the module is built next to the library, same answers
        monkeypatch.undo()
        monkeypatch.setenv("NBDEBUG_CACHE_DIR", str(tmp_path))
        native._reset()
        assert native.status().endswith("; CPython entry points)") and native._fast_stats is not None
        _identical(native.stats(t, (0.0, 1.0), units=True), (row, alive))


@needs_ext
def test_a_bad_module_in_the_cache_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_builds: None) -> None:
    _argv, target = _cache_target(tmp_path, monkeypatch)
    ext = native_build.ext_path(target.parent)
    ext.write_bytes(b"\x7fELF truncated")
    native._reset()
    assert native.available() and native.status().endswith("; CPython entry points)"), native.status()
    assert ext.stat().st_size > 1000 and not list(tmp_path.rglob(".build-*"))


@needs_ext
def test_a_module_that_fails_to_set_up_leaves_the_ctypes_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    real = native_build.load

    def load() -> tuple[object, str]:
        libs, why = real()
        assert libs is not None

        class Broken:
            def setup(self, *_: object) -> None:
                raise RuntimeError("no")

        return (libs[0], libs[1], Broken()), why

    monkeypatch.setattr(native_build, "load", load)
    native._reset()
    assert native.available() and native._fast_stats is None
    assert native.status().endswith("; ctypes calls: RuntimeError: no)"), native.status()
    assert native.stats(torch.ones(3))[0].tolist() == [3, 3.0, 3.0, 1.0, 1.0, 3, 0, 0, 0]


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
@pytest.mark.parametrize("shape", [(5, 7, 3, 331), (3, 5, 1000), (9, 11, 17), (40, 1030), (16, 1024), (7, 2, 4097), (2, 3, 5, 7)], ids=str)
def test_unit_masks_across_chunk_boundaries(shape: tuple[int, ...]) -> None:
    """Segments (units) that straddle the kernel's 4,096-element chunks, units wrapping within a chunk,
    a column per unit: the mask equals numpy's, on both call paths."""
    g = torch.Generator().manual_seed(sum(shape))
    t = torch.randn(*shape, generator=g).relu()
    dead = torch.rand(shape[1], generator=g) < 0.4
    t[:, dead] = 0.0
    t[-1, -1] = 0.0 if t[:-1, -1].abs().sum() else 1.0  # the last unit's last sample matters on its own
    want = (t.numpy().reshape(shape[0], shape[1], -1) != 0).any(axis=(0, 2))
    for path in (_loaded, _ctypes_only) if HAVE_EXT else (_loaded,):
        with path():
            row, alive = native.stats(t, units=True)
        assert row[IDX["nonzero"]] < row[IDX["numel"]] and alive.tolist() == want.tolist()


@needs_ext
def test_the_module_decides_small_plain_tensors_itself() -> None:
    """The identity tests above hold trivially if the module hands everything back: it must answer
    plain contiguous float32 CPU tensors below GIL_MAX itself, and give SLOW only for what native.py
    decides (non-contiguous memory, a ZeroTensor, GIL_MAX elements or more, bounds not floats)."""
    assert native.available(), native.status()
    fast, slow = native._fast_stats, native._SLOW
    assert fast is not None, native.status()
    for t in [*CASES.values(), torch.tensor(2.5), torch.empty(0, 3), nn.Parameter(torch.randn(3, 4))]:
        if t.is_contiguous() and t.numel() < native.GIL_MAX:
            for sat in SATURATIONS:
                assert fast(t, sat, 1e-3, True) is not slow
    assert fast(torch.randn(4, 6).t(), None, 1e-3, False) is slow
    assert fast(torch._efficientzerotensor((3, 4)), None, 1e-3, True) is slow
    assert fast(torch.randn(native.GIL_MAX), None, 1e-3, False) is slow and fast(torch.randn(native.GIL_MAX - 1), None, 1e-3, False) is not slow
    assert fast(torch.ones(3), (0, 1), 1e-3, False) is slow and fast(torch.ones(3), (0.0, 1.0), 1, False) is slow
    assert fast(torch.ones(3).double(), None, 1e-3, False) is None
    ts = [torch.randn(5), torch.randn(2, 3)]
    buf = np.empty(11, np.float32)
    assert native.gather(ts, buf)
    plan = native.seg_plan(buf, ts)
    assert getattr(plan, "func", None) is native._fast_seg  # the module's run, not the ctypes closure


_CLEARING_MODE = """
import gc, sys, torch
from torch.overrides import TorchFunctionMode
from nbdebug.capture import native
assert native.available() and native._fast_sq is not None, native.status()
grads = []
class Clear(TorchFunctionMode):  # Python code run while the module reads a tensor's attributes
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if grads:
            grads.clear()
            gc.collect()
            junk = [torch.full((1000,), 7.0) for _ in range(100)], [bytearray(64) for _ in range(1000)]
        return out
for _ in range(20):
    grads[:] = [torch.full((1000,), 2.0) for _ in range(50)]
    with Clear():
        got = native.sq_norms(grads)
print(got.tolist() == [4000.0] * 50)
"""


@needs_ext
def test_module_sq_norms_survives_the_list_emptied_during_the_call() -> None:
    """A __torch_function__ mode (or a finaliser) that empties the caller's list while the module
    reads the tensors' attributes: the module works on its own tuple of them (was a segfault)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _CLEARING_MODE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "True", r.stdout


@pytest.mark.skipif(ENV_OFF, reason="NBDEBUG_NATIVE=0 in the environment")
def test_an_empty_tensor_with_a_huge_unit_dimension_needs_no_mask_memory() -> None:
    """No elements, 2**60 units: the kernel writes no mask, so neither path allocates one (was a
    MemoryError on both)."""
    t = torch.empty(0, 2**60)
    for path in (_loaded, _ctypes_only) if HAVE_EXT else (_loaded,):
        with path():
            row, alive = native.stats(t, (0.0, 1.0), units=True)
        assert row[IDX["numel"]] == 0 and alive is None


def test_the_cache_key_changes_with_numpy_and_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module is compiled against the numpy and Python headers of the build: another numpy,
    Python or extension suffix must not load it (a new key, a new folder)."""
    key = native_build._key("cc", b"src")
    monkeypatch.setattr(native_build.np, "__version__", np.__version__ + ".post1")
    assert native_build._key("cc", b"src") != key
    monkeypatch.undo()
    monkeypatch.setattr(native_build.sys, "version", sys.version + "+")
    assert native_build._key("cc", b"src") != key
    monkeypatch.undo()
    real = native_build.sysconfig.get_config_var
    monkeypatch.setattr(native_build.sysconfig, "get_config_var", lambda name: ".other.so" if name == "EXT_SUFFIX" else real(name))
    assert native_build._key("cc", b"src") != key
    monkeypatch.undo()
    assert native_build._key("cc", b"src") == key
