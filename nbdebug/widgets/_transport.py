"""Binary transport between the kernel and the browser.

One serializer turns a tensor or array into ``{"view": memoryview, "dtype": str, "shape": list}``.
ipywidgets lifts every ``memoryview``/``bytes`` out of synced state and custom messages into binary
buffers, so nothing numeric ever travels as a JSON list. The JS side rebuilds typed arrays with
``js/src/lib/ndarray.ts`` (which honours the DataView's ``byteOffset``).

>>> enc = encode_array(np.arange(3, dtype=np.float64))
>>> enc["dtype"], enc["shape"]
('float32', [3])
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["decode_array", "encode_array", "error_text", "pack_arrays"]


def error_text(exc: BaseException) -> str:
    """What a failed request answers: ``"Type: message"``, or just the message for errors meant to be
    read as they are (the model was deleted: ``ModelGoneError``'s message says to re-run the cell).

    >>> from nbdebug.capture.weak import ModelGoneError
    >>> error_text(ModelGoneError())[:21], error_text(KeyError("x"))
    ('the model was deleted', "KeyError: 'x'")
    """
    from ..capture.weak import ModelGoneError

    if isinstance(exc, ModelGoneError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"

# dtypes JS has typed arrays for; others are converted on the way out.
_WIRE = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float32",
    np.dtype(np.float64): "float32",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int8): "int8",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.int16): "int16",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int32",
    np.dtype(np.uint64): "uint32",
    np.dtype(np.bool_): "uint8",
}


def _to_numpy(x: Any) -> np.ndarray:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach()
            if x.dtype in (torch.bfloat16, torch.float16):
                x = x.float()
            return x.cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return np.asarray(x)


def encode_array(x: Any) -> dict[str, Any]:
    """Encode a tensor/array as ``{"view", "dtype", "shape"}`` with a contiguous little-endian buffer.

    float16/float64 become float32, int64 becomes int32 (values must fit), bool becomes uint8.
    """
    a = _to_numpy(x)
    wire = _WIRE.get(a.dtype)
    if wire is None:
        raise TypeError(f"cannot send dtype {a.dtype} to the browser")
    if a.dtype.kind in "iu" and a.dtype.itemsize == 8 and a.size:
        info = np.iinfo(np.int32 if wire == "int32" else np.uint32)
        if a.min() < info.min or a.max() > info.max:
            raise OverflowError(f"{a.dtype} values do not fit in {wire}")
    a = np.ascontiguousarray(a, dtype=np.dtype(wire).newbyteorder("<"))
    view = memoryview(a).cast("B") if a.size else memoryview(b"")
    return {"view": view, "dtype": wire, "shape": list(a.shape)}


def decode_array(enc: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode_array` (used by tests and by messages coming back from JS)."""
    buf = enc["view"]
    return np.frombuffer(bytes(buf), dtype=np.dtype(enc["dtype"]).newbyteorder("<")).reshape(
        enc["shape"]
    )


def pack_arrays(
    content: dict[str, Any], arrays: dict[str, Any] | None
) -> tuple[dict[str, Any], list[memoryview]]:
    """Put named arrays into a message: metadata in ``content["arrays"]``, bytes in the buffer list."""
    buffers: list[memoryview] = []
    meta: dict[str, Any] = {}
    for name, value in (arrays or {}).items():
        enc = encode_array(value)
        meta[name] = {"dtype": enc["dtype"], "shape": enc["shape"], "buffer": len(buffers)}
        buffers.append(enc["view"])
    return {**content, "arrays": meta}, buffers
