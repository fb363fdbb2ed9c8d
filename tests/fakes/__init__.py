"""Every fake the tests run Kode on, by the layer it stands in for; each name is used once
in tests/ and says what its fake does. ``tests/`` is on ``sys.path`` (pytest puts the
folder of tests/conftest.py there), so every folder imports ``fakes.<module>``.

- ``fakes.completion``: backends and generations under the completion engine and the
  language server (scripted, caching, stepped, gated, clocked, failing, timed, ...), and
  ``engine_for``, a ``CompletionEngine`` over one.
- ``fakes.serving``: backends under ``kode serve``'s workers and the router (a local
  backend stand-in and its factory, a scripted remote).
- ``fakes.llama``: a model-free llama engine and target under ``LocalBackend`` and its
  worker.
- ``fakes.shared_engine``: what the shared engine's tests over a real Unix socket run on
  (a slow backend, an ``EngineServer`` on the test's loop, a window's client).
- ``fakes.timing``: waiting for a condition (``until``) or for the engine's background
  work (``settled``), and a clock the test sets.
- ``fakes.projects``: small projects written to disk.
"""
