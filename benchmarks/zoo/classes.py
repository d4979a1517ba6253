"""The fault classes and the finding codes that name each (today's codes and the loop-bug codes of
docs/diagnosis.md, with their aliases): a root finding names a class when its code is in the set.

One place to read what the bench accepts: a fault's accepted codes are its class's, plus the few
its module adds (``also=``)."""

from __future__ import annotations

from .base import klass

__all__ = [
           "BATCH_MIXED",
           "BN_ONE",
           "BROADCAST",
           "CLIPPING",
           "DEAD",
           "EXPLODING",
           "FP16",
           "GRAPH_CUT",
           "INPUT_SCALE",
           "LR_HIGH",
           "LR_LOW",
           "NAN_BWD",
           "NAN_FWD",
           "NAN_INPUT",
           "NAN_LOSS",
           "NOT_IN_OPT",
           "NOT_ZEROED",
           "NO_STEP",
           "OUTPUT_LOSS",
           "SATURATED",
           "SCHEDULE",
           "UNRELATED",
           "UNSHUFFLED",
           "VANISHING",
           "WEIGHT_DECAY",
]

_NAN = ("nonfinite", "nan_origin_fwd", "nan_origin_bwd")
LR_HIGH = klass("lr high", "lr_high", "loss_spike", "loss_diverged", "diverged", "loss_rising")
LR_LOW = klass("lr low", "lr_low", "update_low")
DEAD = klass("dead ReLU", "became_dead", "dead", "dead_units")
SATURATED = klass("saturation", "saturated")
VANISHING = klass("vanishing gradient", "vanishing", "grad_fell", "grad_vanishing")
EXPLODING = klass("exploding gradient", "exploding", "grad_exploding", "exploding_grad")
NAN_FWD = klass("NaN forward", "nonfinite", "nan_origin_fwd")
NAN_BWD = klass("NaN backward", "nonfinite", "nan_origin_bwd")
NAN_INPUT = klass("NaN input", "nonfinite", "nan_input", "input_nonfinite")
NAN_LOSS = klass("NaN in the loss", "loss_nonfinite", "nonfinite_loss", "nan_loss")
FP16 = klass("fp16 overflow", *_NAN, "overflow", "fp16_overflow")
SCHEDULE = klass("scheduler per batch", "lr_low", "update_low", "lr_decayed", "schedule")
CLIPPING = klass("clipping far too low", "lr_low", "update_low", "clip_too_low", "clipped")
BN_ONE = klass("BatchNorm one sample", "raised")
WEIGHT_DECAY = klass("weight decay too strong", "weight_decay", "weight_decay_high", "weights_shrinking", "wd_dominates")
NOT_ZEROED = klass("zero_grad forgotten", "grad_not_zeroed", "grads_not_zeroed", "grad_accumulates", "zero_grad_missing",
                   "stale_grad", "grad_not_reset")
NO_STEP = klass("no optimizer step", "no_step", "not_stepped", "params_unchanged", "step_missing", "no_update",
                "step_before_backward", "grad_discarded")
NOT_IN_OPT = klass("params not in the optimizer", "not_in_optimizer", "params_not_in_optimizer", "unoptimized",
                   "optimizer_params", "optimizer_foreign", "foreign_optimizer", "no_optimizer")
GRAPH_CUT = klass("graph cut", "graph_cut", "detached", "no_grad_reach", "grad_missing", "no_grad")
UNRELATED = klass("inputs and labels unrelated", "loss_at_chance", "chance_loss", "loss_chance", "unrelated",
                  "stuck_at_chance", "loss_stuck")
UNSHUFFLED = klass("data not shuffled", "unshuffled", "not_shuffled", "class_swing", "sorted_data")
INPUT_SCALE = klass("inputs not normalised", "input_scale", "inputs_unscaled", "unnormalised", "input_unnormalised",
                    "raw_inputs")
OUTPUT_LOSS = klass("output and loss disagree", "double_softmax", "probabilities_to_ce", "relu_logits", "logits_relu",
                    "sigmoid_before_bce", "double_sigmoid", "output_loss", "relu_output", "output_clamped",
                    "output_mismatch", "probabilities_in_loss")
BROADCAST = klass("broadcasting loss", "torch_warning", "broadcast_loss", "loss_broadcast", "shape_mismatch",
                  "pytorch_warning", "warning")
BATCH_MIXED = klass("samples mixed across the batch", "batch_mixed", "samples_mixed", "batch_mixing",
                    "softmax_over_batch", "batch_dependence", "mixes_batch")
