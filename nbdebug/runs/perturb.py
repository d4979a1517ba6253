"""Forwards of nbdebug's own on perturbed copies of one sample, batched in chunks.

The perturbation CAMs (AblationCAM, Score-CAM) and the faithfulness metrics ask the model about many
copies of one sample with something changed: the input masked, blurred or imputed
(:meth:`Perturbed.inputs`), or one layer's output replaced (:meth:`Perturbed.layer`: the copies
run from that layer on only). The copies go on the batch dimension, ``chunk`` at a time; every
chunk runs as nbdebug's own pass (:func:`~nbdebug.runs.own.own_pass`: no grad, clones of the buffers,
the RNG forked, the user's hooks set aside), so an exception or a
KeyboardInterrupt between chunks leaves the model exactly as it was.

>>> p = Perturbed(model, args, kwargs, sample=0, chunk=32)                 # doctest: +SKIP
>>> p.inputs(lambda i, j: x[0] * masks[i:j], len(masks), pick)              # n × K scores
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..capture.eager import eager
from ..capture.hooks import HookSet
from ..capture.leaves import replace_first_output
from ..capture.select import unwrap_compiled
from .own import own_pass
from .points import CallCounter

__all__ = ["CPU_BATCH_BYTES", "Perturbed", "chunk_size", "image_slot"]

#: a function building copies ``i`` to ``j`` (exclusive) of what is perturbed, on the batch dim
Make = Callable[[int, int], torch.Tensor]
#: the scores wanted from one forward's output: a ``n × K`` tensor for a batch of ``n``
Pick = Callable[[Any], torch.Tensor]


#: on the CPU, a chunk's inputs fill at most this many bytes: a larger batch's activations leave the
#: cache and every image costs more (EfficientNet-Lite0 on 224² images, one thread: 0.048 CPU-s an
#: image in batches of 4, 0.079 in batches of 16)
CPU_BATCH_BYTES = 2_500_000


def chunk_size(max_bytes: int, item_bytes: int, n: int, *, cpu_input_bytes: int | None = None) -> int:
    """How many perturbed copies of ``item_bytes`` each run at once under ``max_bytes`` (at least 1);
    with ``cpu_input_bytes`` (one copy's input, on the CPU), also no more than fill :data:`CPU_BATCH_BYTES`."""
    if n <= 0:
        return 1
    most = int(max_bytes) // max(int(item_bytes), 1)
    if cpu_input_bytes is not None:
        most = min(most, CPU_BATCH_BYTES // max(int(cpu_input_bytes), 1))
    return max(1, min(n, most))


def image_slot(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, int | str] | None:
    """Where the image batch is among a call's arguments: ``("kw", "pixel_values")``, else the first
    4-d floating-point tensor (``("arg", i)`` or ``("kw", name)``); None without one."""
    if isinstance(kwargs.get("pixel_values"), torch.Tensor):
        return "kw", "pixel_values"
    for i, v in enumerate(args):
        if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point():
            return "arg", i
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point():
            return "kw", k
    return None


class Perturbed:
    """Batched forwards on perturbed copies of sample ``sample`` of a call ``model(*args, **kwargs)``.

    Tensors whose first dim is the image batch's are cut to the sample and repeated once per copy;
    other arguments are passed as they are. ``on_chunk(done, total)`` is called after each chunk
    (a progress bar). ``forwards`` counts the chunks run, ``items`` the copies.
    """

    def __init__(self, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], *, sample: int = 0, chunk: int = 16,
                 on_chunk: Callable[[int, int], None] | None = None) -> None:
        self.model = unwrap_compiled(model)
        self.args, self.kwargs = tuple(args), dict(kwargs)
        slot = image_slot(self.args, self.kwargs)
        if slot is None:
            raise ValueError("no image among the model's inputs (pixel_values or a 4-d float tensor)")
        self.slot = slot
        image = self.args[slot[1]] if slot[0] == "arg" else self.kwargs[slot[1]]  # type: ignore[index]
        self.batch = int(image.shape[0])
        if not 0 <= sample < self.batch:
            raise IndexError(f"sample {sample} out of range (batch of {self.batch})")
        self.sample = sample
        self.image = image[sample]
        self.chunk = max(1, int(chunk))
        self.on_chunk = on_chunk
        self.forwards = 0
        self.items = 0
        self.broadcast = True  # Perturbed.layer: the part before the layer ran once (False: once per copy)

    def _repeat(self, value: Any, n: int) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.batch:
            part = value[self.sample : self.sample + 1]
            return part.expand(n, *part.shape[1:]) if n != 1 else part
        return value

    def _call(self, n: int, image: torch.Tensor | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = [self._repeat(a, n) for a in self.args]
        kwargs = {k: self._repeat(v, n) for k, v in self.kwargs.items()}
        if image is not None:
            kind, key = self.slot
            if kind == "arg":
                args[key] = image  # type: ignore[index]
            else:
                kwargs[key] = image  # type: ignore[index]
        return tuple(args), kwargs

    def _chunks(self, n: int) -> Iterator[tuple[int, int]]:
        for i in range(0, n, self.chunk):
            yield i, min(n, i + self.chunk)

    def _done(self, j: int, n: int) -> None:
        self.forwards += 1
        if self.on_chunk is not None:
            self.on_chunk(j, n)

    def inputs(self, make: Make, n: int, pick: Pick) -> torch.Tensor:
        """``pick`` of the model's output on inputs ``make(i, j)`` (the image argument; the sample's
        other arguments repeated), all ``n`` copies in chunks → ``n × K`` (float32, detached)."""
        out: list[torch.Tensor] = []
        with own_pass(self.model):
            for i, j in self._chunks(n):
                batch = make(i, j)
                args, kwargs = self._call(j - i, batch)
                scores = pick(self.model(*args, **kwargs))
                out.append(scores.detach().float())
                self.items += j - i
                self._done(j, n)
        return torch.cat(out) if out else torch.zeros(0)

    def layer(self, module: str, call: int, make: Make, n: int, pick: Pick) -> torch.Tensor:
        """``pick`` of the model's output with call ``call`` of ``module`` returning ``make(i, j)``
        instead of its output (its first tensor), in chunks → ``n × K`` (float32, detached).

        The part of the model before the layer runs once on the sample and the copies broadcast
        from there on; when the model cannot (it reshapes with a batch size read from its input, or
        concatenates with an earlier tensor), each chunk runs on the sample repeated instead.
        """
        target = self.model.get_submodule(module)
        pending: list[torch.Tensor] = []
        calls = CallCounter(1)

        def hook(_m: nn.Module, _args: Any, output: Any) -> Any:
            if not calls.this_one(0, call) or not pending:
                return None
            return replace_first_output(output, lambda _t: pending.pop())

        out: list[torch.Tensor] = []
        with own_pass(self.model), HookSet() as hooks:
            hooks.forward(target, eager(hook))
            for i, j in self._chunks(n):
                batch = make(i, j)
                scores = None
                if self.broadcast:
                    calls.reset()
                    pending[:] = [batch]
                    try:
                        args, kwargs = self._call(1, None)
                        scores = pick(self.model(*args, **kwargs))
                        if scores.shape[0] != j - i or pending:
                            scores = None
                    except RuntimeError:
                        if i > 0:
                            raise
                        scores = None
                    if scores is None:
                        self.broadcast = False
                if scores is None:
                    calls.reset()
                    pending[:] = [batch]
                    args, kwargs = self._call(j - i, None)
                    scores = pick(self.model(*args, **kwargs))
                    if pending:
                        raise RuntimeError(f"call {call + 1} of {module!r} did not run in the forward pass")
                out.append(scores.detach().float())
                self.items += j - i
                self._done(j, n)
        return torch.cat(out) if out else torch.zeros(0)
