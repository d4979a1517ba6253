"""Token attribution: "why A, not B?" (``nbdebug.attribute``).

Layout: ``runs`` (a prompt's runs with replaced token embeddings, batched under a byte budget, as
nbdebug's own passes), ``methods`` (gradient × input, integrated gradients, occlusion), ``faithfulness``
(deletion vs random-order curves), ``result`` (:class:`Attribution`), ``tokens`` (:func:`attribute`).
Hooks are registered only by ``nbdebug.runs.interventions``; the embedding module is found by
``nbdebug.adapters.embedding``; the metric is the causal workbench's (``nbdebug.workbench.metric``).
"""

from .result import Attribution
from .tokens import attribute

__all__ = ["Attribution", "attribute"]
