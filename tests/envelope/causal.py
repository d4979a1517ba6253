"""Real-use rows for the causal workbench (issue 20) and attribution (issue 21): what each operation is
in a user's cell, its content, and the hygiene it must keep.

An *operation* is a column of the Works-with table: ``patch`` (``nbdebug.patch``, exact, and
``patch[attribution]``), ``ablate`` and ``steer`` (context managers; ``steer`` also around
``generate()``), ``patching`` (``--view patching``), ``cams`` (``--view gradcam --method all
--faithfulness --sanity``), ``attribution`` (``nbdebug.attribute`` as ``attribution[api]`` and
``--view attribution``). :func:`content` runs one on a tiny model and returns its content as plain
arrays; each mode's result must equal the plain mode's (the plain mode itself equals a hand
reference: plain hooks, a hand gradient). :func:`Snapshot` is the hygiene: hooks, parameters, buffers,
``.grad``, modes and the random state as found.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint

from . import models as M

ANSWER, WRONG = 3, 4
ALPHA = 0.05  # the steer about as large as the residual stream (|h| ≈ 0.1): alpha and the vector both matter
LM_OPS = ["patch", "patch[attribution]", "ablate", "steer", "patching", "attribution[api]", "attribution"]
VIEW_OPS = {"patching": "patching", "attribution": "attribution", "cams": "gradcam"}


class Stop(Exception):
    """The user's exception, raised mid-grid / mid-attribution."""


def prompts(vocab: int = M.VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """(clean, corrupt): the matrix's prompt and a copy with positions 2 and 4 changed."""
    clean = M.prompt() % vocab
    corrupt = clean.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 7) % vocab
    corrupt[0, 4] = (corrupt[0, 4] + 11) % vocab
    return clean, corrupt


def mode_context(mode: str) -> Any:
    return {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, nullcontext)()


class Snapshot:
    """Hooks, parameters/buffers/``.grad``/``requires_grad``/modes and the RNG of ``model`` now."""

    def __init__(self, model: nn.Module) -> None:
        self.fp = fingerprint(model)
        self.hooks = hook_count(model)
        self.rng = torch.get_rng_state()
        self.modes = [m.training for m in model.modules()]

    def same(self, model: nn.Module) -> None:
        assert hook_count(model) == self.hooks, f"hooks {self.hooks} -> {hook_count(model)}"
        assert same_fingerprint(self.fp, fingerprint(model)) == []
        assert torch.equal(self.rng, torch.get_rng_state()), "the random state moved"
        assert self.modes == [m.training for m in model.modules()]


def blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.transformer.h) if hasattr(model, "transformer") else list(model.model.layers)


def out_proj(model: nn.Module, layer: int) -> nn.Module:
    b = blocks(model)[layer]
    return b.attn.c_proj if hasattr(b, "attn") else b.self_attn.o_proj


def last_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return (out if isinstance(out, torch.Tensor) else out.logits)[0, -1].detach().double()


def steer_vector(model: nn.Module) -> torch.Tensor:
    d = model.config.hidden_size
    return torch.linspace(-1.0, 1.0, d, dtype=next(model.parameters()).dtype)


# -- hand references (plain hooks), for the plain mode ------------------------------------------------
def hand_patch(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor) -> np.ndarray:
    """resid grid, one forward per patch: block l's input at position p from the clean run, into the corrupt run."""
    bl = blocks(model)
    saved: dict[int, torch.Tensor] = {}

    def keep(i: int) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            saved[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return hook

    def record(ids: torch.Tensor) -> dict[int, torch.Tensor]:
        saved.clear()
        hs = [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(bl)]
        with torch.no_grad():
            model(ids)
        for h in hs:
            h.remove()
        return dict(saved)

    record(clean)
    grid = np.zeros((len(bl), clean.shape[1]))
    for i, b in enumerate(bl):
        for p in range(clean.shape[1]):
            def put(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], p: int = p, i: int = i) -> Any:
                x = (args[0] if args else kwargs["hidden_states"]).clone()
                x[:, p] = saved[i][:, p]
                return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
            h = b.register_forward_pre_hook(put, with_kwargs=True)
            with torch.no_grad():
                lg = last_logits(model, corrupt)
            h.remove()
            grid[i, p] = float(lg[ANSWER] - lg[WRONG])  # identical cells too: nbdebug gives the unpatched run's metric
    return grid


def hand_patch_attribution(model: nn.Module, clean: torch.Tensor, corrupt: torch.Tensor) -> np.ndarray:
    """Attribution patching by hand (denoise: the corrupt run is the base, the clean run the source):
    ``m(corrupt) + (a_clean − a_corrupt) · ∂m/∂a``, ``a`` block l's input at position p, the gradient
    of ``m = logit[answer] − logit[wrong]`` (last position) taken with ``torch.autograd.grad`` on the
    corrupt run's block inputs, caught by plain forward pre-hooks; NaN where the clean and corrupt
    activations are identical (as the exact grid)."""
    bl = blocks(model)
    saved: dict[int, torch.Tensor] = {}

    def keep(i: int) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            saved[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    def run(ids: torch.Tensor) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        saved.clear()
        hs = [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(bl)]
        try:
            out = model(ids)
        finally:
            for h in hs:
                h.remove()
        return dict(saved), (out if isinstance(out, torch.Tensor) else out.logits)[0, -1]

    with torch.no_grad():
        source = {i: a.detach().clone() for i, a in run(clean)[0].items()}
    with torch.enable_grad():
        acts, lg = run(corrupt)
        m = lg[ANSWER] - lg[WRONG]
        grads = torch.autograd.grad(m, [acts[i] for i in range(len(bl))])
    grid = np.zeros((len(bl), clean.shape[1]))
    for i in range(len(bl)):
        diff = (source[i] - acts[i].detach()).double()[0]  # T×d
        # where clean and corrupt agree, diff is 0 and the estimate is the unpatched metric (a PatchGrid's
        # raw value there: nothing to patch changes nothing)
        grid[i] = (float(m.detach()) + (diff * grads[i].double()[0]).sum(-1)).numpy()
    return grid


def hand_ablate(model: nn.Module, ids: torch.Tensor) -> np.ndarray:
    """Head 1 of layer 0 zeroed at the output projection's input."""
    proj, hd = out_proj(model, 0), model.config.hidden_size // model.config.num_attention_heads

    def zero(_m: nn.Module, args: tuple[Any, ...]) -> Any:
        x = args[0].clone()
        x[..., hd:2 * hd] = 0
        return (x, *args[1:])

    h = proj.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            return last_logits(model, ids).numpy()
    finally:
        h.remove()


def steer_hook(model: nn.Module) -> Any:
    v = steer_vector(model)

    def add(_m: nn.Module, _a: Any, out: Any) -> Any:
        if isinstance(out, tuple):
            return (out[0] + ALPHA * v.to(out[0].dtype), *out[1:])
        return out + ALPHA * v.to(out.dtype)

    return blocks(model)[0].register_forward_hook(add)


def hand_steer(model: nn.Module, ids: torch.Tensor, generate: bool = False) -> np.ndarray:
    h = steer_hook(model)
    try:
        with torch.no_grad():
            if generate:
                return model.generate(ids, max_new_tokens=M.NEW_TOKENS, do_sample=False, pad_token_id=0).numpy()
            return last_logits(model, ids).numpy()
    finally:
        h.remove()


def hand_attribute(model: nn.Module, ids: torch.Tensor) -> np.ndarray:
    """grad × input on the token embedding's output, m = logit[answer] − logit[wrong] at the last position."""
    import copy

    model = copy.deepcopy(model).float()  # bf16: the reference in float32 on a copy
    emb = model.get_input_embeddings()
    with torch.enable_grad():
        e = emb(ids).detach().requires_grad_(True)
        out = model(inputs_embeds=e)
        lg = out.logits[0, -1]
        (g,) = torch.autograd.grad(lg[ANSWER] - lg[WRONG], e)
    return (g * e).sum(-1)[0].detach().double().numpy()


def reference(op: str, model: nn.Module) -> dict[str, np.ndarray]:
    """The plain-mode content by hand (ops whose content a few hooks reproduce)."""
    if op == "cams":
        return {}
    clean, corrupt = prompts(model.config.vocab_size)
    if op in ("patch", "patching"):
        return {"raw": hand_patch(model, clean, corrupt)}
    if op == "patch[attribution]":
        return {"raw": hand_patch_attribution(model, clean, corrupt)}
    if op == "ablate":
        return {"logits": hand_ablate(model, clean)}
    if op == "steer":
        return {"logits": hand_steer(model, clean)}
    if op == "steer[generate]":
        return {"sequences": hand_steer(model, clean, generate=True)}
    if op in ("attribution[api]", "attribution"):
        return {"scores": hand_attribute(model, clean)}
    return {}


# -- the operations as a user writes them ----------------------------------------------------------
def run_api(op: str, model: nn.Module, mode: str, progress: Any = None, metric: Any = None) -> dict[str, np.ndarray]:
    """An API operation in ``mode``'s context (``progress``/``metric``: to raise mid-grid)."""
    clean, corrupt = prompts(model.config.vocab_size)
    with mode_context(mode):
        if op.startswith("patch"):
            method = "attribution" if op == "patch[attribution]" else "exact"
            kw: dict[str, Any] = {"metric": metric} if metric else {"answer": ANSWER, "wrong": WRONG}
            g = nbdebug.patch(model, clean, corrupt, sites="resid", method=method, progress=progress or False, **kw)
            return {"raw": np.asarray(g.raw, dtype=np.float64)}
        if op == "ablate":
            with nbdebug.ablate(model, heads={0: [1]}, mode="zero"):
                return {"logits": last_logits(model, clean).numpy()}
        if op == "steer":
            with nbdebug.steer(model, layer=0, vector=steer_vector(model), alpha=ALPHA):
                return {"logits": last_logits(model, clean).numpy()}
        if op == "steer[generate]":
            with nbdebug.steer(model, layer=0, vector=steer_vector(model), alpha=ALPHA):
                return {"sequences": model.generate(clean, max_new_tokens=M.NEW_TOKENS, do_sample=False, pad_token_id=0).numpy()}
        if op == "attribution[api]":
            kw = {"metric": metric} if metric else {"answer": ANSWER, "wrong": WRONG}
            a = nbdebug.attribute(model, clean, method="grad_x_input", **kw)
            return {"scores": np.asarray(a.scores, dtype=np.float64)}
    raise ValueError(op)


def view_options(op: str, model: nn.Module) -> dict[str, Any]:
    if op == "patching":
        return {"corrupt": prompts(model.config.vocab_size)[1], "answer": ANSWER, "wrong": WRONG}
    if op == "attribution":
        return {"answer": ANSWER, "wrong": WRONG}
    return {"cam_method": "all", "faithfulness": True, "sanity": True, "cam_topk": 2}


def view_content(op: str, result: Any) -> dict[str, np.ndarray]:
    if op == "patching":
        return {"raw": np.asarray(result.raw, dtype=np.float64)}
    if op == "attribution":
        return {"scores": np.asarray(result.scores, dtype=np.float64)}
    out = {f"low[{m}]": np.asarray(result.low(m), dtype=np.float64) for m in result.methods}
    out.update({f"faith[{m}]": np.array([v[k] for k in sorted(v)]) for m, v in result.faithfulness.items()})
    out.update({"sanity": np.array([result.sanity[m] for m in result.methods])})
    return out


def view_input(op: str, model: nn.Module) -> torch.Tensor:
    return M.image().to(next(model.parameters()).dtype) if op == "cams" else prompts(model.config.vocab_size)[0]


def call(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


def equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    """Same keys, each array equal to ``want``'s to ``tol`` × its scale (NaN where ``want`` has NaN);
    integer arrays (token ids) exactly, whatever ``tol``."""
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k, w in want.items():
        if np.issubdtype(np.asarray(w).dtype, np.integer):
            np.testing.assert_array_equal(np.asarray(got[k]), w, err_msg=k)
            continue
        g = np.asarray(got[k], dtype=np.float64)
        w = np.asarray(w, dtype=np.float64)
        scale = float(np.nanmax(np.abs(w))) if np.isfinite(w).any() else 1.0
        np.testing.assert_allclose(g, w, atol=tol * max(scale, 1e-3), rtol=0, equal_nan=True, err_msg=k)
