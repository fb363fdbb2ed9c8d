"""``kode serve``: a team completion server speaking SGLang's and OpenAI's HTTP APIs.

    editors (backend "remote"/"auto")  ->  kode serve  ->  local llama.cpp engine
                                                       or  SGLang workers / sglang_router

- ``auth``: API keys (``name:key`` lines), kept only as sha256 digests;
- ``metrics``: Prometheus counters and histograms, written by hand;
- ``service``: requests become jobs: per-key limits, latest-wins per document, aborts;
- ``app``: the starlette application (``/generate``, ``/abort_request``,
  ``/v1/completions``, ``/v1/models``, ``/health``, ``/metrics``).
"""
