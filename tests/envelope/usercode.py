"""The user's side of the matrix: tiny models per mode, the cell body each mode runs, and the
reference (the same cell on an identical copy without nbdebug) the views are compared with."""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from . import models as M

LANG = ("gpt2", "llama", "bert")
#: modes whose cell leaves an autograd graph the user may still backpropagate through
GRAPH_MODES = {"plain", "inplace_relu", "inputs_embeds", "tuple_output", "parametrized", "nonsquare", "kwargs_call", "channels_last", "input_grad", "dropout", "autocast", "pending_backward", "user_hooks", "shared", "fp16", "bf16", "int_outputs"}
RAISING = {"exception": ValueError, "keyboard_interrupt": KeyboardInterrupt}
TRAIN_STEPS = 3  # optimizer steps of the train_step cell
NAN_STEP = 6  # 1-based: the 6th call of the model's forward makes the first non-finite value
STEPS = 8
#: modes whose cell calls the model several times (it returns the list of outputs) → how many times
LOOPS = {"nan_loop": STEPS, "train_step": TRAIN_STEPS}
PAD = 2  # left-padding of item 1 in the padded mode


@dataclass
class Outcome:
    """What one cell saw (for the checks and the Works-with table)."""

    view: str
    note: str = ""  # the one-line note when the view did not show
    result: Any = None
    widget: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- models and inputs ---------------------------------------------------------------------------
def family_of(mode: str, view: str) -> str:
    if mode == "shape_error":
        return "shape_error"
    if "[" in view:
        return view.split("[")[1].rstrip("]")
    if mode == "not_applicable":
        return "mlp" if view in ("featuremaps", "gradcam") else "cnn"
    if mode == "shape_error":
        return "shape_error"
    return "cnn"


def view_name(view: str) -> str:
    return view.split("[")[0]


def build(mode: str, family: str) -> tuple[nn.Module, Any]:
    if family == "cnn":
        ckpt = {"ckpt_reentrant": True, "ckpt_nonreentrant": False}.get(mode)
        model: nn.Module = M.tiny_cnn(ckpt=ckpt, int_outputs=mode == "int_outputs", interrupt=mode == "interrupt_in_forward",
                                      dropout=mode == "dropout", inplace=mode == "inplace_relu")
        inp: Any = M.image((8, 12) if mode == "nonsquare" else (8, 8))
    elif family == "mlp":
        model, inp = M.mlp(), torch.randn(2, 6, generator=torch.Generator().manual_seed(3))
    elif family == "shape_error":
        model, inp = M.shape_error_cnn(), torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(3))
    else:
        model, inp = M.tiny_lm(family), M.prompt()
        if mode == "padded":  # a batch of two, the second left-padded by 2 (how generate() batches are padded)
            ids = torch.cat([inp, inp.roll(1, dims=1)])
            mask = torch.ones_like(ids)
            mask[1, :PAD] = 0
            ids[1, :PAD] = 0
            inp = {"input_ids": ids, "attention_mask": mask}
        if mode == "hf_ckpt":
            import warnings

            with warnings.catch_warnings():  # transformers 5 renames it; users still call this name
                warnings.simplefilter("ignore", FutureWarning)
                model.gradient_checkpointing_enable()
            model.train()
            for m in model.modules():  # dropout off, so the reference run is identical
                if isinstance(m, nn.Dropout):
                    m.p = 0.0
    if mode == "parametrized":  # weight_norm / spectral_norm style: conv1 and conv2 get parametrizations
        from torch.nn.utils.parametrizations import weight_norm

        weight_norm(model.conv1)
        weight_norm(model.conv2)
    if mode == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        inp = inp.contiguous(memory_format=torch.channels_last)
    if mode == "frozen":  # a frozen (inference-only) model: no parameter requires grad
        model.requires_grad_(False)
    if mode == "dtype_error":  # the beginner's other error: a half model, a float32 batch
        model = model.half()
    if mode in ("fp16", "bf16"):
        dt = torch.float16 if mode == "fp16" else torch.bfloat16
        model = model.to(dt)
        if inp.is_floating_point():
            inp = inp.to(dt)
    return model, inp


class Raiser:
    """A user's forward hook that raises (``armed``) and remembers the exception instances it raised."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc = exc
        self.raised: list[BaseException] = []

    def __call__(self, _m: nn.Module, _a: Any, _o: Any) -> None:
        e = self.exc("raised by the user's hook")
        self.raised.append(e)
        raise e


class Counter:
    """A user's forward hook counting its calls (it must be kept and called as often as without nbdebug)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *_: Any) -> None:
        self.calls += 1


def raise_site(model: nn.Module, family: str) -> nn.Module:
    """Where the mid-cell exception comes from: ``conv2`` (CNN) or the last transformer block."""
    if family == "cnn":
        return model.conv2
    return model.get_submodule({"gpt2": "transformer.h.1", "bert": "encoder.layer.1"}.get(family, "model.layers.1"))


def user_hook_sites(model: nn.Module, family: str) -> list[nn.Module]:
    if family == "cnn":
        return [model.relu, model.conv1]  # the shared module (2 calls per forward) and a plain one
    return [raise_site(model, family)]


# -- the user's code -----------------------------------------------------------------------------
def mode_context(mode: str) -> AbstractContextManager[Any]:
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    if mode == "autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def user_code(mode: str, family: str, model: nn.Module, inp: Any) -> Any:
    """The cell body. Returns what the user keeps (the output; a list of outputs for loops)."""
    lm = family in LANG
    with mode_context(mode):
        if mode in ("generate", "generate_user_hooks"):
            return model.generate(inp, max_new_tokens=M.NEW_TOKENS, do_sample=False, pad_token_id=0)
        if mode == "nan_loop":
            outs = []
            for step in range(1, STEPS + 1):
                x = inp if step != NAN_STEP else torch.full_like(inp, torch.finfo(inp.dtype).max)
                outs.append(model(x))
            return outs
        if mode == "train_step":  # a few SGD steps: parameters change inside the cell
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            outs = []
            for _ in range(TRAIN_STEPS):
                opt.zero_grad()
                out = model(inp)
                out.float().pow(2).mean().backward()
                opt.step()
                outs.append(out)
            return outs
        if mode == "double_backward":  # a gradient penalty (WGAN-GP, PINNs): autograd.grad with create_graph
            xi = inp.detach().requires_grad_(True)
            out = model(xi)
            (g,) = torch.autograd.grad(out.sum(), xi, create_graph=True)
            g.pow(2).sum().backward()
            return out
        if isinstance(inp, dict):
            return model(**inp)
        if mode == "kwargs_call":
            return model(x=inp)
        if mode == "inputs_embeds":  # soft prompts, multimodal inputs: no token ids at all
            return model(inputs_embeds=model.get_input_embeddings()(inp).detach())
        if mode == "tuple_output":
            return model(inp, labels=inp, return_dict=False)
        if mode == "hf_ckpt":
            out = model(inp, labels=inp)
            out.loss.backward()
            return out
        out = model(inp)
        if mode in ("ckpt_reentrant", "ckpt_nonreentrant"):
            logits(out, lm).float().sum().backward()
        return out


def logits(out: Any, lm: bool) -> torch.Tensor:
    if lm and isinstance(out, tuple):  # return_dict=False: (loss, logits, ...)
        return out[1] if out[0].dim() == 0 else out[0]
    if lm:
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
    return out[0] if isinstance(out, tuple) else out


def backward(out: Any, lm: bool) -> None:
    logits(out, lm).float().sum().backward()


def output_tensors(out: Any, name: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a module's output by the names the views give them: ``name`` for a tensor,
    ``name[i]`` for the items of a tuple or list, ``name.key`` for a dict's (HF ``ModelOutput``)."""
    if isinstance(out, torch.Tensor):
        return [(name, out)]
    if isinstance(out, dict):
        return [leaf for k, v in out.items() for leaf in output_tensors(v, f"{name}.{k}")]
    if isinstance(out, (tuple, list)):
        return [leaf for i, v in enumerate(out) for leaf in output_tensors(v, f"{name}[{i}]")]
    return []


def reference_activations(model: nn.Module, fn: Callable[[nn.Module], Any],
                          expect: type[BaseException] | tuple[type[BaseException], ...] | None = None,
                          forward: int = 1) -> dict[str, torch.Tensor]:
    """Every module call's output in one forward of the model, by call name (a plain-hook run of
    ``fn`` on a copy; the global RNG is seeded with 0 first, as the runs compared, and restored after).

    ``forward``: which call of the model's forward to record (1-based; -1: the last); calls of
    submodules before the first forward (``model.get_input_embeddings()(ids)`` in the cell) count
    as the first's. ``expect``: the exception the mode plants; the reference must raise exactly
    that, and any other failure propagates (a reference cut short would leave rows unchecked).
    """
    from nbdebug.capture.names import call_name

    m = copy.deepcopy(model)
    acts: dict[str, torch.Tensor] = {}
    seen: dict[str, int] = {}
    state = {"calls": 0}

    def pre(*_: Any) -> None:
        state["calls"] += 1
        if forward == -1:  # keep only the latest forward
            acts.clear()
            seen.clear()

    handles = [m.register_forward_pre_hook(pre)]
    for name, mod in m.named_modules():
        # every submodule but a parametrization's own (called when the weight is read)
        if name and ".parametrizations" not in name:
            def hook(_m: nn.Module, _a: Any, out: Any, name: str = name) -> None:
                calls = state["calls"]
                if not (forward == -1 or calls == forward or (calls == 0 and forward == 1)):
                    return
                leaves = output_tensors(out, name)
                if not leaves:
                    return
                k = seen.get(name, 0)
                seen[name] = k + 1
                base = call_name(name, k)
                for leaf, t in leaves:
                    acts[base + leaf[len(name):]] = t.detach().clone()
            handles.append(mod.register_forward_hook(hook))
    raised: BaseException | None = None
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same random draws (dropout) as the two runs compared
        try:
            fn(m)
        except BaseException as exc:
            raised = exc
        finally:
            for h in handles:
                h.remove()
    if raised is not None and (expect is None or not isinstance(raised, expect)):
        raise AssertionError(f"the reference run (without nbdebug) failed unexpectedly: {raised!r}") from raised
    assert expect is None or raised is not None, f"the reference run did not raise the planted {expect}"
    return acts


# -- running one cell ------------------------------------------------------------------------


class Float64Watch:
    """Records ops that produce float64 tensors while active (half-precision stats accumulate in
    float32; MPS has no float64). The models and cells themselves create none."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.hits: list[str] = []
        self._mode: Any = None

    def __enter__(self) -> Float64Watch:
        if self.active:
            from torch.utils._python_dispatch import TorchDispatchMode
            from torch.utils._pytree import tree_leaves

            hits = self.hits

            class Watch(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                    out = func(*args, **(kwargs or {}))
                    if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_leaves(out)):
                        hits.append(str(func))
                    return out

            self._mode = Watch()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)


def same_output(mode: str, out: Any, ref_out: Any, lm: bool) -> None:
    """The cell computes what it computes without nbdebug (same values, same dtype)."""
    if out is None:
        return
    if mode.startswith("generate"):
        assert torch.equal(out, ref_out), "generate() produced other tokens under nbdebug"
        return
    pairs = zip(out, ref_out) if mode in LOOPS else [(out, ref_out)]
    half = mode in ("fp16", "bf16", "autocast")
    for a, b in pairs:
        x, y = logits(a, lm), logits(b, lm)
        assert x.dtype == y.dtype, f"output dtype {y.dtype} -> {x.dtype}"
        tol = 1e-2 if half else 1e-5
        assert torch.allclose(x.float(), y.float(), atol=tol, rtol=tol, equal_nan=True), \
            f"the cell's output changed under nbdebug (max |diff| {float((x.float() - y.float()).abs().nan_to_num().max()):.2e})"


def close(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, half: bool) -> bool:
    x = torch.as_tensor(np.asarray(a, dtype=np.float32))
    y = torch.as_tensor(np.asarray(b.detach().float().cpu() if isinstance(b, torch.Tensor) else b, dtype=np.float32))
    tol = 3e-2 if half else 1e-3
    return x.shape == y.shape and bool(torch.allclose(x, y, atol=tol, rtol=tol))
