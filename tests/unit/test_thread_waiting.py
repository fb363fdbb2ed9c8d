"""How llama.cpp's OpenMP threads wait (``cli/engine.py``): a short spin unless the user
chose (docs/engine.md, "Busy machine"). No model."""

from __future__ import annotations

from kode.backends.system import SPIN_COUNT, choose_thread_waiting


def test_a_short_spin_unless_the_user_chose_how_threads_wait() -> None:
    environ: dict[str, str] = {}
    choose_thread_waiting(environ)
    assert environ == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        environ = dict(chosen)
        choose_thread_waiting(environ)
        assert environ == chosen
