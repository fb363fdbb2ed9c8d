"""Backends turn a prompt into a stream of tokens; one folder per engine.

llama/        the llama.cpp engine (default local path)
torch/        the PyTorch/transformers engine (optional; GPUs)
remote/       SGLang / OpenAI-compatible servers over HTTP
speculative/  speculative decoding as pure algorithms (no model, no runtime)

base.py       the ``Backend`` and ``Generation`` protocols, requests, stats
errors.py     every error Kode raises on purpose, in one tree
worker.py     what the local engines share: worker-thread runs, counters, learning
router.py     local / remote / auto routing with a circuit breaker
models.py     provisioning model files (PyPI parts, paths, hub)
kv_reuse.py   pure planner for reusing moved KV entries after an edit
"""
