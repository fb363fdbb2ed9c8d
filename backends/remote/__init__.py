"""Remote engines: an SGLang server (or any OpenAI-compatible one) over HTTP.

sse.py       server-sent events, parsed incrementally
clients.py   ``SGLangBackend`` and ``OpenAIBackend``: the ``Backend`` protocol over HTTP
"""
