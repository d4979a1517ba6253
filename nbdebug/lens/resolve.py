"""What ``--lens`` (``lens=`` in Python) names: ``logit`` (no translator), ``tuned`` / ``shortcut`` (a
fitted lens of that kind from the notebook's namespace, else one fitted now on the Python
documentation's English text, ``pydoc_data.topics``, on a small budget and kept for the model), a
variable holding a :class:`FittedLens`, a lens object itself, or a folder path (:func:`load_lens`).
``"tuned,logit"`` names two: the view shows the first and marks where the second's top-1 differs.

>>> main, other = resolve_lens("tuned,logit", model, user_ns)      # doctest: +SKIP
"""

from __future__ import annotations

import pathlib
import weakref
from typing import Any

from torch import nn

from .fit import fit_lens
from .formats import load_lens
from .lens import FittedLens

__all__ = ["QUICK_BUDGET", "local_text", "resolve_lens", "resolve_one"]

#: seconds given to a lens fitted by ``--lens tuned|shortcut`` when the notebook holds none
QUICK_BUDGET = {"shortcut": 60.0, "tuned": 180.0}
_FITTED: weakref.WeakKeyDictionary[nn.Module, dict[str, FittedLens]] = weakref.WeakKeyDictionary()


def local_text() -> list[str]:
    """English text every Python install carries: the pydoc topics (~0.7 MB), sorted by name."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _from_namespace(kind: str, user_ns: dict[str, Any] | None, model: nn.Module) -> FittedLens | None:
    for name, value in reversed(list((user_ns or {}).items())):
        if isinstance(value, FittedLens) and value.kind == kind and not name.startswith("_"):
            try:
                return value.attach(model) if value.blocks == len(_blocks(model)) else None
            except ValueError:
                continue
    return None


def _blocks(model: nn.Module) -> list[Any]:
    from ..adapters.transformers import find_parts

    return find_parts(model).blocks


def resolve_one(value: Any, model: nn.Module, *, tokenizer: Any = None, user_ns: dict[str, Any] | None = None,
                notes: list[str] | None = None) -> FittedLens | None:
    """One lens: ``None`` for the logit lens."""
    notes = notes if notes is not None else []
    if value is None or (isinstance(value, str) and value.strip() in ("", "logit")):
        return None
    if isinstance(value, FittedLens):
        return value.attach(model)
    text = str(value).strip()
    if user_ns and text.isidentifier() and isinstance(user_ns.get(text), FittedLens):
        return user_ns[text].attach(model)
    if text in ("tuned", "shortcut"):
        found = _from_namespace(text, user_ns, model) or _FITTED.get(model, {}).get(text)
        if found is not None:
            return found
        if tokenizer is None:
            raise ValueError(f"--lens {text}: no {text} lens in the notebook and no --tokenizer to fit one; "
                             f"lens = nbdebug.fit_lens(model, tok, texts, kind={text!r}) first, then --lens lens")
        lens = fit_lens(model, tokenizer, local_text(), kind=text, max_seconds=QUICK_BUDGET[text], holdout=256)
        _FITTED.setdefault(model, {})[text] = lens
        notes.append(f"fitted a {text} lens now on the Python docs' text ({lens.info.get('tokens')} tokens, "
                     f"{lens.info.get('seconds')} s); nbdebug.fit_lens with a larger budget fits a better one")
        return lens
    path = pathlib.Path(text).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".pt"):  # a lens folder, or a Jacobian lens's lens.pt
        return load_lens(path, model)
    raise ValueError(f"--lens {text!r}: logit, tuned, shortcut, a variable holding a fitted lens, a lens folder or a Jacobian lens's .pt file")


def resolve_lens(value: Any, model: nn.Module, *, tokenizer: Any = None, user_ns: dict[str, Any] | None = None,
                 notes: list[str] | None = None) -> tuple[FittedLens | None, FittedLens | None, bool]:
    """``(shown, compared, compare)``: the lens shown, the one it is compared with (``None`` = the logit
    lens), and whether there is a comparison (a lens other than the logit lens is compared with the
    logit lens unless a second one is named)."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str) and "," in value:
        items = [v for v in value.split(",") if v.strip()]
    else:
        items = [value]
    if len(items) > 2:
        raise ValueError(f"--lens names at most two lenses (shown, compared), got {len(items)}")
    shown = resolve_one(items[0], model, tokenizer=tokenizer, user_ns=user_ns, notes=notes)
    if len(items) == 2:
        return shown, resolve_one(items[1], model, tokenizer=tokenizer, user_ns=user_ns, notes=notes), True
    return shown, None, shown is not None
