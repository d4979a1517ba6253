"""Lenses from a local folder: ``load_lens(path, model)``.

Three layouts are read (nothing is downloaded):

* **nbdebug's own** (``lens.save``): tuned-lens's two files plus ``nbdebug.json`` (kind, held-out quality).
* **tuned-lens** (Belrose et al. 2023, the ``tuned_lens`` package's ``TunedLens.save``): ``config.json``
  (``d_model``, ``num_hidden_layers``, ``bias``, ``lens_type: "linear_tuned_lens"``) and ``params.pt``,
  the state dict of ``layer_translators``: ``{i}.weight`` ``(d, d)`` and ``{i}.bias`` ``(d,)`` for
  ``i = 0 … num_hidden_layers − 1``, translator ``i`` reading ``hidden_states[i]`` (0: the embeddings) as
  ``h + W_i h + b_i`` before the final norm and unembedding.
* **Jacobian lens** (Anthropic's ``jlens`` package, ``JacobianLens.save``; ``from_pretrained`` reads
  ``lens.pt`` in a folder): one ``torch.save`` file holding ``{"J": {layer: (d, d)}, "n_prompts": int,
  "source_layers": [layers], "d_model": int}`` (``J`` stored in float16 by default). ``layer`` is a
  block index: ``J_l`` reads the *output of block* ``l`` (``hidden_states[l + 1]``, nbdebug's row
  ``l + 1``) as ``J_l h`` (``residual @ J_l.T``), then the final norm, the unembedding and the softcap
  (``lm_head(norm(J_l h))``). The embeddings row and any block not in ``source_layers`` have no matrix:
  they are read as the logit lens reads them (identity) and listed in ``lens.info["rows_without_matrix"]``;
  a matrix for the last block (the output itself) is not used. ``load_lens`` takes the folder or the
  ``.pt`` file itself.

>>> lens = load_lens("lenses/smollm2-tuned", model)                # doctest: +SKIP
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import torch
from torch import nn

from .lens import KINDS, FittedLens

__all__ = ["load_lens"]

JACOBIAN_FILE = "lens.pt"


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


def _jacobian(path: pathlib.Path) -> tuple[dict[int, torch.Tensor], dict[str, Any], int]:
    """``A``/``c`` of a ``jlens`` ``JacobianLens.save`` file: ``J_l`` at row ``l + 1``, identity elsewhere."""
    raw = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(raw, dict) or "J" not in raw or not isinstance(raw["J"], dict):
        keys = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{path}: not a Jacobian lens file (JacobianLens.save writes a dict with 'J'; found {keys})")
    J = {int(k): v for k, v in raw["J"].items()}
    if not J:
        raise ValueError(f"{path}: 'J' holds no matrix")
    d = int(raw.get("d_model") or next(iter(J.values())).shape[-1])
    for k, v in J.items():
        if tuple(v.shape) != (d, d):
            raise ValueError(f"{path}: J[{k}] is {tuple(v.shape)}, expected ({d}, {d}) (d_model {d})")
        if k < 0:
            raise ValueError(f"{path}: J has a negative layer {k}")
    return J, raw, d


def _jacobian_lens(path: pathlib.Path, model: nn.Module | None) -> FittedLens:
    J, raw, d = _jacobian(path)
    blocks = max(J) + 1
    if model is not None:
        from ..adapters.transformers import find_parts

        blocks = find_parts(model).n_layers
    elif raw.get("source_layers"):
        blocks = max(blocks, max(int(x) for x in raw["source_layers"]) + 1)
    if max(J) >= blocks:
        raise ValueError(f"{path}: J has block {max(J)}; the model has {blocks} blocks: load a lens for this model")
    A = torch.eye(d).repeat(blocks, 1, 1)
    for layer, m in J.items():
        if layer + 1 < blocks:  # the last block's output is the output itself: read as it is
            A[layer + 1] = m.float()
    missing = [r for r in range(blocks) if r == 0 or (r - 1) not in J]
    info = {"n_prompts": raw.get("n_prompts"), "source_layers": sorted(J), "rows_without_matrix": missing}
    return FittedLens("jacobian", A, torch.zeros(blocks, d), model=model, info=info,
                      source=f"Jacobian lens ({path.parent.name or path.name})")


def load_lens(path: str | pathlib.Path, model: nn.Module | None = None) -> FittedLens:
    """A lens from a folder (nbdebug's, tuned-lens's or a Jacobian lens's layout), attached to ``model``
    (its final norm and unembedding) when given."""
    folder = pathlib.Path(path).expanduser()
    if folder.is_file() and folder.suffix == ".pt":
        return _jacobian_lens(folder, model)
    if not folder.is_dir():
        raise FileNotFoundError(f"no lens folder at {str(folder)!r} (a folder written by lens.save, or tuned-lens's "
                                "config.json + params.pt, or a Jacobian lens's lens.pt)")
    own = folder / "nbdebug.json"
    if (folder / "config.json").exists() and (folder / "params.pt").exists():
        A, c, config = _tuned_lens(folder)
        meta = json.loads(own.read_text()) if own.exists() else {}
        kind = meta.get("kind", "tuned")
        if kind not in KINDS:
            raise ValueError(f"{own}: kind {kind!r}")
        info = dict(meta.get("info", {}), model=config.get("base_model_name_or_path", ""))
        lens = FittedLens(kind, A, c, quality=meta.get("quality"), info=info, source=f"{kind} lens ({folder.name})")
    elif (folder / JACOBIAN_FILE).exists():
        return _jacobian_lens(folder / JACOBIAN_FILE, model)
    else:
        raise FileNotFoundError(f"{str(folder)!r} holds no lens: expected config.json + params.pt (tuned-lens, "
                                f"nbdebug) or a Jacobian lens's {JACOBIAN_FILE} (jlens's JacobianLens.save)")
    if model is not None:
        lens.attach(model)
    return lens
