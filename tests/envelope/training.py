"""Training-loop cells of the real-use matrix (issue 10): the loop each mode runs, the reference loop's
own per-step measurements, and running one such cell under ``nbdebug.debug`` with the usual hygiene.

Every mode trains a fresh ``TinyCNN`` (train-mode BatchNorm, the shared ``relu`` called twice) or the
MLP with cross-entropy and an optimizer made *before* the cell, on batches drawn up front. The
reference runs the same loop on an identical copy with its own plain hooks (per training forward:
each row's mean and zero fraction, by call name) and its own ``‖Δθ‖/‖θ‖`` per optimizer step (θ
before the step); the history under nbdebug must equal those measurements step by step.

Modes beyond the plain loop: bf16 autocast with a GradScaler, pure bf16/fp16 weights and fp16
autocast without one, a ``torch.compile``d model (compiled and warmed up before the cell),
``torch.autograd.detect_anomaly()`` (with an overflow: anomaly mode's own error), ``--every``,
``--break-on``, interrupts, gradient accumulation, two optimizers (``fc`` and the rest) stepped after
each backward.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import models as M

STEPS = 6
NAN_AT = 3  # --break-on: the step whose input overflows conv1
INTERRUPT_AT = 4  # KeyboardInterrupt right after this step's forward
EVERY = 3
ACCUM = 2
SKIP_AT = 3  # GradScaler: the step whose scaled loss overflows (its optimizer step is skipped)


@dataclass
class Loop:
    """What one mode's loop does (see :func:`loop`)."""

    steps: int = STEPS
    eval_every: int = 0  # a no-grad eval forward after every N-th step
    scaler: bool = False  # bf16 autocast + torch.amp.GradScaler("cpu")
    autocast: torch.dtype | None = None  # the forward under torch.autocast("cpu", dtype) (set by scaler: bfloat16)
    dtype: torch.dtype | None = None  # the model and its batches in this dtype (pure half-precision training)
    compiled: bool = False  # the loop calls torch.compile(model, backend="eager"), compiled before the cell
    anomaly: bool = False  # the loop runs under torch.autograd.detect_anomaly() (users hunting a NaN)
    compiled_autograd: bool = False  # backward under compiled autograd (TorchDynamo traces the backward and its hooks)
    accum: int = 1  # micro-batches per optimizer step
    two_optimizers: bool = False  # one optimizer for ``fc``, one for the rest, both stepped after each backward
    interrupt_at: int | None = None
    interrupt_in_forward: int | None = None  # the model's own forward raises KeyboardInterrupt after conv2 at this step
    nan_at: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scaler and self.autocast is None:
            self.autocast = torch.bfloat16

    @property
    def half(self) -> bool:
        """Whether the loop computes in half precision (stats compared with a half's tolerance)."""
        return self.autocast is not None or self.dtype is not None


MODES: dict[str, Loop] = {
    "train_history": Loop(),
    "train_eval": Loop(eval_every=2),
    "grad_scaler": Loop(scaler=True),
    "every": Loop(steps=10, options={"every": EVERY}),
    "break_nonfinite": Loop(nan_at=NAN_AT, options={"break_on": "nonfinite"}),
    "interrupt_loop": Loop(interrupt_at=INTERRUPT_AT),
    "interrupt_loop_forward": Loop(interrupt_in_forward=INTERRUPT_AT),
    "grad_accum": Loop(steps=8, accum=ACCUM),
    "grad_accum_opt": Loop(steps=8, accum=ACCUM, options={"step_on": "optimizer"}),
    "two_optimizers_opt": Loop(two_optimizers=True, eval_every=2, options={"step_on": "optimizer"}),
    # Ctrl-C after the first micro-batch of an optimizer step (step_on="optimizer": that step is open)
    "interrupt_accum_opt": Loop(steps=8, accum=ACCUM, interrupt_at=INTERRUPT_AT + 1, options={"step_on": "optimizer"}),
    # modes users train in without a GradScaler: pure bf16 / fp16 weights, fp16 autocast
    "train_bf16": Loop(dtype=torch.bfloat16),
    "train_fp16": Loop(dtype=torch.float16),
    "autocast_fp16": Loop(autocast=torch.float16),
    "compiled_loop": Loop(compiled=True),
    "anomaly": Loop(anomaly=True),
    "compiled_autograd": Loop(compiled_autograd=True),
    "anomaly_nan": Loop(anomaly=True, nan_at=NAN_AT),  # anomaly mode's RuntimeError in step NAN_AT's backward
}


def build(mode: str) -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The model, its optimizer (made before the cell, with momentum state) and the batches."""
    spec = MODES[mode]
    g = torch.Generator().manual_seed(5)
    if spec.scaler:
        model: nn.Module = M.mlp()
        batches = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(spec.steps)]
        x, y = batches[SKIP_AT - 1]
        batches[SKIP_AT - 1] = (x * 1e35, y)  # finite forward, a loss that overflows once scaled
    else:
        model = M.tiny_cnn()
        batches = [(torch.randn(*M.IMAGE_SHAPE, generator=g), torch.randint(0, M.N_CLASSES, (M.IMAGE_SHAPE[0],), generator=g))
                   for _ in range(spec.steps)]
        if spec.nan_at:
            x, y = batches[spec.nan_at - 1]
            batches[spec.nan_at - 1] = (torch.full_like(x, torch.finfo(x.dtype).max), y)
    if spec.dtype is not None:
        model = model.to(spec.dtype)
        batches = [(x.to(spec.dtype), y) for x, y in batches]
    opt: Any = TwoOptimizers(model) if spec.two_optimizers else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, batches


class TwoOptimizers:
    """What the loop calls ``opt`` in the two-optimizer mode: ``fc``'s own SGD (another learning rate)
    and one for the rest, zeroed and stepped one after the other; each a real ``torch.optim`` optimizer."""

    def __init__(self, model: nn.Module) -> None:
        head = list(model.fc.parameters())
        body = [p for p in model.parameters() if all(p is not q for q in head)]
        self.parts = [torch.optim.SGD(body, lr=0.05, momentum=0.9), torch.optim.SGD(head, lr=0.02, momentum=0.5)]

    def zero_grad(self) -> None:
        for o in self.parts:
            o.zero_grad()

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def state_dict(self) -> list[dict[str, Any]]:
        return [o.state_dict() for o in self.parts]


class CountingBackend:
    """``backend="eager"`` that counts the runs of its compiled graphs (``calls``): TorchDynamo's
    tracing and guards without Inductor's code generation, as the matrix's compiled rows."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, _example: Any) -> Any:
        def run(*args: Any) -> Any:
            self.calls += 1
            return gm.forward(*args)

        return run


def compiled(model: nn.Module, warm: torch.Tensor | None = None) -> tuple[nn.Module, CountingBackend]:
    """What a ``compiled`` mode's loop calls, ``torch.compile(model, backend=...)``, and that backend.
    ``warm``: one compiled training forward and backward on that batch first (the user trained
    compiled before the cell; the gradients are dropped again, BatchNorm's running stats moved)."""
    backend = CountingBackend()
    c = torch.compile(model, backend=backend)
    if warm is not None:
        c(warm).float().sum().backward()
        for p in model.parameters():
            p.grad = None
    return c, backend


def first_activations(mode: str, model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every leaf call's output in the loop's first training forward (on a copy of ``model``, by call name)."""
    from .usercode import reference_activations

    spec = MODES[mode]

    def forward(m: nn.Module) -> Any:
        with torch.autocast("cpu", dtype=spec.autocast) if spec.autocast is not None else nullcontext():
            return m(x)

    return reference_activations(model, forward)


def loop(mode: str, model: nn.Module, opt: torch.optim.Optimizer, batches: list[tuple[torch.Tensor, torch.Tensor]],
         ns: dict[str, Any], scaler: Any = None) -> list[torch.Tensor]:
    """The cell body: the user's training loop. ``ns["loss"]`` holds the step's loss (``--loss loss``)."""
    spec = MODES[mode]
    if not spec.anomaly:
        return _steps(spec, model, opt, batches, ns, scaler)
    with warnings.catch_warnings():  # "Anomaly Detection has been enabled. This mode will increase the runtime"
        warnings.simplefilter("ignore", UserWarning)
        with torch.autograd.detect_anomaly():
            return _steps(spec, model, opt, batches, ns, scaler)


def _steps(spec: Loop, model: nn.Module, opt: torch.optim.Optimizer, batches: list[tuple[torch.Tensor, torch.Tensor]],
           ns: dict[str, Any], scaler: Any) -> list[torch.Tensor]:
    outs = []
    for s, (x, y) in enumerate(batches, 1):
        if (s - 1) % spec.accum == 0:
            opt.zero_grad()
        if spec.interrupt_in_forward == s:
            model.interrupt = True  # TinyCNN's own switch: Ctrl-C landing inside forward, after conv2
        with torch.autocast("cpu", dtype=spec.autocast) if spec.autocast is not None else nullcontext():
            out = model(x)
            loss = F.cross_entropy(out.float(), y)
        ns["loss"] = loss
        if spec.interrupt_at == s:
            raise KeyboardInterrupt("stopped by the user mid-loop")
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            with _compiled_autograd() if spec.compiled_autograd else nullcontext():
                (loss / spec.accum).backward()
            if s % spec.accum == 0:
                opt.step()
        if spec.eval_every and s % spec.eval_every == 0:
            model.eval()
            with torch.no_grad():
                model(x[:1])
            model.train()
        outs.append(out.detach())
    return outs


def _compiled_autograd() -> Any:
    """The backward under compiled autograd with the eager backend (tracing without code generation)."""
    from torch._dynamo import compiled_autograd

    return compiled_autograd._enable(torch.compile(backend="eager"))


@dataclass
class Measured:
    """The reference loop's own per-step measurements (1-based steps → values)."""

    stats: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # row → [(mean, zero_frac)] per training forward
    ratio: dict[str, dict[int, float]] = field(default_factory=dict)  # module → {step: ‖Δθ‖/‖θ‖}
    loss: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    outs: list[torch.Tensor] = field(default_factory=list)
    raised: BaseException | None = None


def planted(mode: str, batches: int | None = None) -> type[BaseException] | None:
    """The exception ``mode``'s loop raises by design (over ``batches`` batches: --break-on's reference
    stops before the overflow), or None."""
    spec = MODES[mode]
    if spec.interrupt_at or spec.interrupt_in_forward:
        return KeyboardInterrupt
    if spec.anomaly and spec.nan_at and (batches is None or batches >= spec.nan_at):
        return RuntimeError  # anomaly mode's own error in the overflowing step's backward
    return None


def reference(mode: str, model: nn.Module, opt: torch.optim.Optimizer, batches: list[tuple[torch.Tensor, torch.Tensor]],
              scaler: Any = None) -> Measured:
    """Run the loop on ``model``/``opt`` (copies of the user's) measuring every step by hand. Only the
    exception the mode plants (:func:`planted`) may end it, and it must: any other failure propagates
    (measurements cut short would be compared as if complete)."""
    from nbdebug.capture.names import call_name

    got = Measured()
    calls: dict[str, int] = {}
    step = {"n": 0}

    def pre(_m: nn.Module, _a: Any) -> None:
        if torch.is_grad_enabled():
            step["n"] += 1
            calls.clear()

    handles = [model.register_forward_pre_hook(pre)]
    for name, mod in model.named_modules():
        if name and not list(mod.children()):
            def hook(_m: nn.Module, _a: Any, out: Any, name: str = name) -> None:
                if not torch.is_grad_enabled() or not isinstance(out, torch.Tensor):
                    return
                k = calls.get(name, 0)
                calls[name] = k + 1
                o = out.detach().float()
                got.stats.setdefault(call_name(name, k), []).append((float(o.mean()), float((o == 0).float().mean())))
            handles.append(mod.register_forward_hook(hook))
    before: dict[str, list[torch.Tensor]] = {}
    mods = {n: m for n, m in model.named_modules() if n and list(m.parameters(recurse=False))}

    def stepped(o: torch.optim.Optimizer) -> dict[str, nn.Module]:
        """The modules whose parameters ``o`` steps."""
        held = {id(p) for g in o.param_groups for p in g["params"]}
        return {n: m for n, m in mods.items() if any(id(p) in held for p in m.parameters(recurse=False))}

    def opt_pre(o: torch.optim.Optimizer, *_: Any) -> None:
        before.clear()
        before.update({n: [p.detach().clone() for p in m.parameters(recurse=False)] for n, m in stepped(o).items()})

    def opt_post(o: torch.optim.Optimizer, *_: Any) -> None:
        for n, m in stepped(o).items():
            # in float32: a half parameter's own arithmetic would round the difference away
            d = sum(float((p.detach().float() - q.float()).pow(2).sum()) for p, q in zip(m.parameters(recurse=False), before[n])) ** 0.5
            got.ratio.setdefault(n, {})[step["n"]] = d / sum(float(q.float().pow(2).sum()) for q in before[n]) ** 0.5

    for o in opt.parts if isinstance(opt, TwoOptimizers) else [opt]:
        handles += [o.register_step_pre_hook(opt_pre), o.register_step_post_hook(opt_post)]
    ns = LossLog()
    real_update = scaler.update if scaler is not None else None

    def update(*a: Any) -> None:  # a skipped step: the scale went down
        scale = scaler.get_scale()
        real_update(*a)
        if scaler.get_scale() < scale:
            got.skipped.append(step["n"])

    if scaler is not None:
        scaler.update = update
    try:
        got.outs = loop(mode, model, opt, batches, ns, scaler)
    except BaseException as exc:
        got.raised = exc
    finally:
        for h in handles:
            h.remove()
        if scaler is not None:
            del scaler.update
    want = planted(mode, len(batches))
    if got.raised is not None and (want is None or not isinstance(got.raised, want)):
        raise AssertionError(f"the reference loop (without nbdebug) failed unexpectedly: {got.raised!r}") from got.raised
    assert want is None or got.raised is not None, f"the reference loop did not raise the planted {want.__name__}"
    got.loss = ns.seen
    return got


class LossLog(dict):  # type: ignore[type-arg]
    """The cell's namespace in the reference run: remembers every ``loss`` the loop sets."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "loss":
            self.seen.append(float(value.detach()) if hasattr(value, "detach") else float(value))
        super().__setitem__(key, value)


def copies(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An identical model and an optimizer over its parameters with the same hyper-parameters and state."""
    ref = copy.deepcopy(model)
    if isinstance(opt, TwoOptimizers):
        ref_two = TwoOptimizers(ref)
        for mine, theirs in zip(ref_two.parts, opt.parts):
            mine.load_state_dict(copy.deepcopy(theirs.state_dict()))
        return ref, ref_two  # type: ignore[return-value]
    ref_opt = type(opt)(ref.parameters(), **opt.defaults)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    return ref, ref_opt
