"""The llama.cpp engine (llama-cpp-python): the default local path.

runtime.py   model and context over llama.cpp's C API: batches, KV sequences, one thread
target.py    the context as a ``steppers.Target`` (token trees in KV sequences), the
             draft model, lookahead decoding (llama.cpp-only), calibration
backend.py   ``LlamaEngine`` and ``LlamaBackend`` (the generic ``LocalBackend`` over it)
build_flags.py  the CMake flags that build llama.cpp for this machine's CPU (install time)
"""
