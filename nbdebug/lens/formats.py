"""Lenses from a local folder: ``load_lens(path, model)``.

Three layouts are read (nothing is downloaded):

* **nbdebug's own** (``lens.save``): tuned-lens's two files plus ``nbdebug.json`` (kind, held-out quality).
* **tuned-lens** (Belrose et al. 2023, the ``tuned_lens`` package's ``TunedLens.save``): ``config.json``
  (``d_model``, ``num_hidden_layers``, ``bias``, ``lens_type: "linear_tuned_lens"``) and ``params.pt``,
  the state dict of ``layer_translators``: ``{i}.weight`` ``(d, d)`` and ``{i}.bias`` ``(d,)`` for
  ``i = 0 … num_hidden_layers − 1``, translator ``i`` reading ``hidden_states[i]`` (0: the embeddings) as
  ``h + W_i h + b_i`` before the final norm and unembedding.
* **Jacobian lens** (maps each residual with the mean Jacobian ``E[∂h_L/∂h_l]``): ``jacobians.pt`` (or
  ``jacobians.npy`` / ``jacobians.safetensors``) holding either a tensor ``(L, d, d)`` or a dict
  ``{layer: (d, d)}`` (keys ``0 … L-1`` or ``"layer_0"``…), matrix ``l`` reading ``hidden_states[l]``
  as ``J_l h`` (optionally ``biases`` ``(L, d)`` next to it). No reference implementation of this
  layout was reachable offline: this is the layout we read, documented in docs/lenses.md.

>>> lens = load_lens("lenses/smollm2-tuned", model)                # doctest: +SKIP
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import numpy as np
import torch
from torch import nn

from .lens import KINDS, FittedLens

__all__ = ["load_lens"]

JACOBIAN_FILES = ("jacobians.pt", "jacobians.npy", "jacobians.safetensors")


def _tuned_lens(folder: pathlib.Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    config = json.loads((folder / "config.json").read_text())
    kind = config.get("lens_type", "linear_tuned_lens")
    if kind != "linear_tuned_lens":
        raise ValueError(f"{folder}: lens_type {kind!r}; only tuned-lens's 'linear_tuned_lens' is read")
    L, d = int(config["num_hidden_layers"]), int(config["d_model"])
    state = torch.load(folder / "params.pt", map_location="cpu", weights_only=True)
    state = {re.sub(r"^layer_translators\.", "", k): v for k, v in state.items()}
    A = torch.eye(d).repeat(L, 1, 1)
    c = torch.zeros(L, d)
    for i in range(L):
        w = state.get(f"{i}.weight")
        if w is None:
            raise ValueError(f"{folder}/params.pt: no translator {i}.weight (config.json says {L} layers)")
        if tuple(w.shape) != (d, d):
            raise ValueError(f"{folder}/params.pt: {i}.weight is {tuple(w.shape)}, expected ({d}, {d})")
        A[i] += w.float()
        if config.get("bias", True) and f"{i}.bias" in state:
            c[i] = state[f"{i}.bias"].float()
    return A, c, config


def _read_matrices(path: pathlib.Path) -> Any:
    if path.suffix == ".npy":
        return torch.from_numpy(np.load(path))
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _stack(obj: Any, what: str) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        return obj.float()
    if isinstance(obj, dict):
        def key(k: Any) -> int:
            m = re.search(r"(\d+)$", str(k))
            if m is None:
                raise ValueError(f"{what}: key {k!r} names no layer index")
            return int(m.group(1))

        items = sorted(((key(k), v) for k, v in obj.items() if not str(k).startswith("bias")), key=lambda kv: kv[0])
        if [i for i, _ in items] != list(range(len(items))):
            raise ValueError(f"{what}: layers {[i for i, _ in items]}; expected 0 … {len(items) - 1}")
        return torch.stack([torch.as_tensor(v).float() for _, v in items])
    raise ValueError(f"{what}: a tensor (L, d, d) or a dict of (d, d) matrices, got {type(obj).__name__}")


def _jacobian(folder: pathlib.Path) -> tuple[torch.Tensor, torch.Tensor]:
    path = next(folder / f for f in JACOBIAN_FILES if (folder / f).exists())
    raw = _read_matrices(path)
    bias = raw.get("biases") if isinstance(raw, dict) else None
    A = _stack(raw, str(path))
    if A.dim() != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"{path}: matrices shaped {tuple(A.shape)}; expected (L, d, d)")
    c = torch.as_tensor(bias).float() if bias is not None else torch.zeros(A.shape[:2])
    return A, c


def load_lens(path: str | pathlib.Path, model: nn.Module | None = None) -> FittedLens:
    """A lens from a folder (nbdebug's, tuned-lens's or a Jacobian lens's layout), attached to ``model``
    (its final norm and unembedding) when given."""
    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"no lens folder at {str(folder)!r} (a folder written by lens.save, or tuned-lens's "
                                "config.json + params.pt, or a Jacobian lens's jacobians.pt)")
    own = folder / "nbdebug.json"
    if (folder / "config.json").exists() and (folder / "params.pt").exists():
        A, c, config = _tuned_lens(folder)
        meta = json.loads(own.read_text()) if own.exists() else {}
        kind = meta.get("kind", "tuned")
        if kind not in KINDS:
            raise ValueError(f"{own}: kind {kind!r}")
        info = dict(meta.get("info", {}), model=config.get("base_model_name_or_path", ""))
        lens = FittedLens(kind, A, c, quality=meta.get("quality"), info=info, source=f"{kind} lens ({folder.name})")
    elif any((folder / f).exists() for f in JACOBIAN_FILES):
        A, c = _jacobian(folder)
        lens = FittedLens("jacobian", A, c, source=f"Jacobian lens ({folder.name})")
    else:
        raise FileNotFoundError(f"{str(folder)!r} holds no lens: expected config.json + params.pt (tuned-lens, "
                                f"nbdebug) or one of {', '.join(JACOBIAN_FILES)}")
    if model is not None:
        lens.attach(model)
    return lens
