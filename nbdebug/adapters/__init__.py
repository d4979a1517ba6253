"""Model adapters: where the blocks, attention modules, final norm and unembedding of a model live.

Language models: :mod:`nbdebug.adapters.transformers` (:func:`find_parts`). Vision models have
their own adapter module next to it.
"""
