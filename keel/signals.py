"""Signals a process was started ignoring, given back their defaults.

An ignored signal is inherited across fork and exec: a keel server started from a shell or harness that ignores
SIGTERM (a background job of a non-interactive shell ignores INT and QUIT; one CI run's test process ignored TERM)
could never be stopped by TERM, and neither could anything it starts. Each of keel's long-running entry points
(``gpu_runtime.serve``, ``gpu_runtime.replay``, ``keel.uiguard``, ``scripts/materialize.py``) calls
``restore_default_signals`` first, so it stops on TERM whatever it inherited and starts its children with the
defaults; the test session does the same (tests/conftest.py).
"""

from __future__ import annotations

import signal

INHERITED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT)


def restore_default_signals() -> list[str]:
    """Put back the default disposition of every signal in ``INHERITED`` this process was started ignoring (SIGINT:
    Python's KeyboardInterrupt); returns their names."""
    restored = []
    for sig in INHERITED:
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
            restored.append(sig.name)
    return restored
