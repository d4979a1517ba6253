"""The causal workbench: from seeing to testing. Does this head, this position, this channel cause the
answer? ``nbdebug.patch`` (activation patching grids), ``nbdebug.ablate`` and ``nbdebug.steer``
(context managers), ``nbdebug.steering_vector``; :class:`Workbench` keeps a clean/corrupt pair's
recorded runs for a view's clicks.

Layout (each module one job): ``sites`` (what can be patched, the grid's rows/columns/cells),
``metric`` (what a patch is measured by, prompts as tokens), ``runs`` (a prompt's recorded run: the
cached state), ``exact`` (batched exact patching from cached state), ``attribution_patching`` (the gradient
estimate), ``grid`` (the :class:`PatchGrid` result), ``session`` (:class:`Workbench`), ``patching``
(``patch``), ``targets`` + ``interventions`` (ablate, steer, steering vectors; the bar is ``nbdebug.runs.progress``). Hooks are
registered only by ``nbdebug.runs.interventions`` / ``nbdebug.runs.patchrun``; per-family model
knowledge lives in ``nbdebug.adapters.blockparts`` / ``nbdebug.adapters.blockrun``.

How the exact grid is computed (CPU). A patch at layer ``l`` changes nothing before block ``l``, and in
a causal model nothing before its earliest patched position ``p``. So every patched run starts from the
base run's recorded input of block ``l``, runs positions ``p..T-1`` only, and its attention reads the
base run's recorded keys/values for positions ``< p`` (the model's own cache mechanism). Runs that
share ``p`` are batched and advance together block by block, each joining the batch at its own layer;
only the last position is unembedded. For a ``L``-layer, ``T``-token resid grid this is
``L(L+1)/2 · T(T+1)/2`` block-positions instead of the per-patch loop's ``L² · T²`` (about 4× fewer
FLOPs), in ``L · T`` batched block calls instead of ``L · T`` full forwards of batch 1. Cells whose clean
and corrupt activations are identical (the tokens before the first difference, at every layer) are
not run at all.

On a GPU. The per-patch loop is launch-bound there: a small model's forward of batch 1 is hundreds of
tiny kernels, so 2,160 forwards cost 2,160 × (launch overhead), whatever the FLOPs. The same plan
maps to a few large batches: every chunk is one batched call per block (``L`` calls per start
position); with ``max_bytes`` raised to the card's free memory a whole heads × positions grid of
GPT-2 small is ``T`` groups of ``L · H`` runs, i.e. ``T · L`` ≈ 180 block calls in total (or ``L``
calls if positions are not separated: ``kv_reuse`` off, every run from position 0). Batching is then
the whole win (the FLOP saving matters less than the launch count); nothing in the plan is
CPU-specific: tensors stay on the model's execution device, masks and cached keys/values are created
there, and only the metric values cross to the host, once per chunk.
"""

from .grid import PatchGrid
from .interventions import Ablation, ablate, steer, steering_vector
from .patching import patch
from .session import PatchedRun, Workbench

__all__ = ["Ablation", "PatchGrid", "PatchedRun", "Workbench", "ablate", "patch", "steer", "steering_vector"]
