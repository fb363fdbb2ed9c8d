"""The llama.cpp engine (llama-cpp-python): the default local path.

runtime.py   model and context over llama.cpp's C API: batches, KV sequences, one thread
steppers.py  one target step per decoding method (plain, n-gram tree, draft, lookahead)
backend.py   ``LlamaBackend``: the ``Backend`` protocol on one context and worker thread
"""
