"""Backends turn a prompt into a stream of tokens; one folder per engine.

llama/        the llama.cpp engine (default local path)
torch/        the PyTorch/transformers engine (optional; GPUs)
remote/       SGLang / OpenAI-compatible servers over HTTP
daemon/       the shared engine: one llama.cpp process per user for every window
speculative/  speculative decoding as pure algorithms (no model, no runtime)

base.py       the ``Backend`` and ``Generation`` protocols, requests, stats
local.py      one local backend over any engine (``steppers.py``: the decoding methods)
worker.py     what the local engines share: worker-thread runs, counters, learning
errors.py     every error Kode raises on purpose, in one tree
defaults.py   Kode's version and the defaults every way of running a model shares
system.py     what Kode asks of the operating system (live processes, cores, peers)
framing.py    length-prefixed frames (the engine socket, the index worker's pipes)
latest.py     latest wins per document; stop_strings.py: the earliest stop string
router.py     local / remote / auto routing with a circuit breaker
models.py     provisioning model files (PyPI parts, paths, hub)
kv_reuse.py   pure planner for reusing moved KV entries after an edit
heal_index.py token healing: which tokens may begin a generation
chunks.py     the queue between a generation's producer and its consumer
"""
