"""Models whose layers module hooks cannot see: TorchScript modules (``torch.jit.trace``,
``torch.jit.script``, ``torch.jit.load``: a traced module runs its graph without calling its
submodules' Python ``forward``, a scripted one refuses Python hooks) and graphs exported by
``torch.export`` (``exported.module()`` reads its layers' weights directly; no layer is called as a
module). No view can watch one; every recorder asks :func:`refuse_unhookable` first, which turns
:func:`unhookable_reason` into the view's one-line note.
"""

from __future__ import annotations

import torch
from torch import nn


def _exported_graph(model: nn.Module) -> bool:
    """An FX graph that calls none of its layers (submodules owning parameters or buffers) as a
    module: what ``torch.export`` gives. A symbolically traced model (``torch.fx.symbolic_trace``)
    calls its layers and is watched as usual."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    layers = {name for name, m in model.named_modules()
              if name and (any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False)))}
    called = {n.target for n in model.graph.nodes if n.op == "call_module"}
    return bool(layers) and not layers & called


def unhookable_reason(model: nn.Module) -> str | None:
    """None for a model whose layers hooks can see; otherwise the one line a view shows instead."""
    if isinstance(model, torch.jit.ScriptModule):
        return (f"{type(model).__name__} is a TorchScript module: hooks cannot see inside it "
                "(debug the Python model it was traced or scripted from)")
    if _exported_graph(model):
        return ("the model is a graph exported by torch.export: its layers are not called as modules, so hooks "
                "cannot see them (debug the Python model it was exported from)")
    return None


def refuse_unhookable(model: nn.Module) -> None:
    """Raise :class:`~nbdebug.views.NotApplicableError` (the view's one-line note) for such a model."""
    from ..views import NotApplicableError

    why = unhookable_reason(model)
    if why is not None:
        raise NotApplicableError(why)
