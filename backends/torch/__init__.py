"""The PyTorch/transformers engine (``localEngine: "torch"``; the GPU path for local use).

target.py    ``CausalLM`` (one croppable KV cache) as a ``steppers.Target`` (chains),
             the draft model, calibration
backend.py   model loading, ``TorchEngine`` and ``TorchBackend`` (the generic
             ``LocalBackend`` over it)
"""
