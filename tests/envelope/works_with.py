"""Writes the "Works with" table (rows = modes, columns = views) from the matrix's outcomes."""

from __future__ import annotations

from pathlib import Path

VIEWS = ["thermometer", "featuremaps", "gradcam", "attention", "logitlens", "all"]
LABELS = {
    "plain": "plain forward (train-mode BatchNorm)",
    "no_grad": "`torch.no_grad()`",
    "inference_mode": "`torch.inference_mode()`",
    "autocast": "`torch.autocast(\"cpu\", bfloat16)`",
    "pending_backward": "`out.backward()` after the view",
    "user_hooks": "your own forward hooks on the model",
    "exception": "exception mid-cell",
    "keyboard_interrupt": "KeyboardInterrupt mid-cell",
    "shape_error": "shape mismatch inside the model",
    "dtype_error": "dtype mismatch (half model, float32 batch)",
    "interrupt_in_forward": "KeyboardInterrupt inside `forward`",
    "nan_loop": "loop, NaN at step k",
    "generate": "`model.generate()`",
    "generate_user_hooks": "`model.generate()` with your own hooks",
    "shared": "module called twice (`relu`, `relu#2`)",
    "ckpt_reentrant": "`checkpoint(use_reentrant=True)`",
    "ckpt_nonreentrant": "`checkpoint(use_reentrant=False)`",
    "hf_ckpt": "HF `gradient_checkpointing_enable()`",
    "compiled": "`torch.compile`d model",
    "compiled_loop": "`torch.compile`d model trained in the loop (warmed up before the cell)",
    "fx_traced": "`torch.fx.symbolic_trace`d model",
    "torchscript": "TorchScript module (`torch.jit.trace` / `script` / `load`)",
    "script_child": "a TorchScript block inside a Python model",
    "exported": "`torch.export`ed graph (`exported.module()`)",
    "offloaded": "accelerate-offloaded model (CPU + disk `device_map`), `no_grad`",
    "offloaded_generate": "accelerate-offloaded model, `generate()`",
    "fp16": "float16 model",
    "bf16": "bfloat16 model",
    "int_outputs": "integer / bool outputs",
    "channels_last": "channels-last CNN",
    "dropout": "dropout in training mode",
    "train_step": "training loop (optimizer steps) in the cell",
    "train_history": "training loop: per-step history equal to the loop's own measurements",
    "train_eval": "eval forwards (`no_grad`) inside the training loop",
    "grad_scaler": "bf16 autocast + `GradScaler(\"cpu\")` with a skipped step",
    "train_bf16": "bfloat16 model trained without a GradScaler",
    "train_fp16": "float16 model trained without a GradScaler",
    "autocast_fp16": "`torch.autocast(\"cpu\", float16)` training without a GradScaler",
    "hf_trainer": "`transformers.Trainer.train()` in the cell (accumulation, evaluation)",
    "lightning": "Lightning `trainer.fit` in the cell (`training_step` calls submodules)",
    "anomaly": "`torch.autograd.detect_anomaly()` around the training loop",
    "anomaly_nan": "`detect_anomaly()` and an overflow (its RuntimeError; history up to that step)",
    "compiled_autograd": "the backward under compiled autograd (`torch._dynamo.compiled_autograd`; gradient norms read before the optimizer step)",
    "eval_loop": "evaluation loop over batches (`eval()`, `no_grad`)",
    "eval_loop_interrupt": "evaluation loop over batches, KeyboardInterrupt mid-loop (every batch that ran kept)",
    "ddp": "DDP on 2 gloo processes (`%%nndebug --distributed`)",
    "every": "`--every 3` (sampled steps)",
    "continue": "`--continue run1` across two cells",
    "break_nonfinite": "`--break-on nonfinite` (NonFiniteError at the first Inf)",
    "interrupt_loop": "KeyboardInterrupt mid-loop (history kept)",
    "interrupt_loop_forward": "KeyboardInterrupt inside `forward` mid-loop (history kept)",
    "grad_accum": "gradient accumulation (2 micro-batches per optimizer step)",
    "grad_accum_opt": "gradient accumulation, `step_on=\"optimizer\"` (micro-batches merged)",
    "two_optimizers_opt": "two optimizers stepped after each backward, `step_on=\"optimizer\"` (one step)",
    "interrupt_accum_opt": "KeyboardInterrupt mid-accumulation, `step_on=\"optimizer\"` (the open step kept)",
    "parametrized": "parametrized layers (`weight_norm`)",
    "double_backward": "gradient penalty (`autograd.grad(create_graph=True)`)",
    "frozen": "frozen model (`requires_grad_(False)`)",
    "inplace_relu": "`ReLU(inplace=True)`",
    "nonsquare": "non-square images (8×12)",
    "kwargs_call": "model called with keywords (`model(x=x)`)",
    "inputs_embeds": "`model(inputs_embeds=...)` (no token ids)",
    "tuple_output": "`return_dict=False` (tuple outputs)",
    "padded": "padded batch (`attention_mask`, `--seq-index 1`)",
    "input_grad": "input with `requires_grad` (saliency)",
    "budget0": "`--max-bytes 0` (nothing kept beyond stats)",
    "del_model": "`del model` afterwards (freed)",
    "not_applicable": "view does not apply (MLP / CNN)",
    "reruns": "100 re-runs of the cell",
}


def _merge(marks: list[str]) -> str:
    if not marks:
        return "—"
    if all(m == "✓" for m in marks):
        return "✓"
    if any(m == "✗" for m in marks):
        return "✗" if all(m == "✗" for m in marks) else "partly (" + ", ".join(sorted(set(marks))) + ")"
    notes = sorted({m if len(m) <= 70 else m[:69] + "…" for m in marks if m != "✓"})
    return "note: " + "; ".join(n.replace("|", "/") for n in notes)


def write_table(path: str, outcomes: dict[tuple[str, str], str]) -> None:
    cells: dict[tuple[str, str], list[str]] = {}
    for (mode, view), mark in outcomes.items():
        cells.setdefault((mode, view.split("[")[0]), []).append(mark)
    lines = [
        "# Works with",
        "",
        "Generated from `tests/envelope` (the real-use matrix): ✓ the view is correct in that mode,",
        "`note: …` the view is replaced by that one-line note, ✗ not yet (a strict xfail in the matrix),",
        "— not applicable; `all`: every view at once (`--view all`), each as correct as alone. Language views were run on tiny GPT-2 and Llama models (attention also on a BERT encoder).",
        "",
        "| mode | " + " | ".join(VIEWS) + " |",
        "| --- | " + " | ".join("---" for _ in VIEWS) + " |",
    ]
    for mode, label in LABELS.items():
        row = [_merge(cells.get((mode, v), [])) for v in VIEWS]
        if all(c == "—" for c in row):
            continue
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    Path(path).write_text("\n".join(lines) + "\n")
