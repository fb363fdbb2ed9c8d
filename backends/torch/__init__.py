"""The PyTorch/transformers engine (``localEngine: "torch"``; the GPU path for local use).

steppers.py  ``CausalLM`` (one croppable KV cache) and one target step per method
backend.py   ``TorchBackend``: the ``Backend`` protocol on one worker thread
"""
