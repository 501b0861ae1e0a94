"""Kineto's config thread, stopped when the deep window closes: what makes the window fork-safe.

The first ``torch.profiler`` start creates Kineto's ActivityProfilerController, which starts
``libkineto::ConfigLoader``'s update thread: it polls a config file and the dynolog daemon every
few seconds, sleeping on a condition variable, and nothing stops it until the process's static
destructors run. A process forked while it sleeps copies the condition variable with that waiter
counted in it, but not the thread; when the child ends normally (``sys.exit``, the end of its
script), ``~ConfigLoader`` calls ``pthread_cond_destroy``, which waits for the waiter forever, and
so does the parent in ``os.waitpid``. A child that ends with ``os._exit`` (multiprocessing's
workers) runs no destructors and never hangs.

``ConfigLoader::stopThread`` (Kineto's own teardown, exported by libtorch_cpu) wakes and joins
the thread. The window calls it as it closes, so a process that profiled is left as one that
never did. With ``KINETO_USE_DAEMON`` set, Kineto starts the thread at ``import torch`` for the
dynolog daemon, the job's own choice: it is left running (a fork then behaves as it does without
doctor). Nothing here loads a library: the lookup uses ``RTLD_NOLOAD``.
"""

from __future__ import annotations

import os

ENV_DAEMON = "KINETO_USE_DAEMON"
LIBRARY = "libtorch_cpu.so"
#: ``libkineto::ConfigLoader::instance()`` and ``libkineto::ConfigLoader::stopThread()``
#: (Itanium ABI names; present since Kineto's 2022 ConfigLoader, so in every torch >= 2.1).
INSTANCE = "_ZN9libkineto12ConfigLoader8instanceEv"
STOP_THREAD = "_ZN9libkineto12ConfigLoader10stopThreadEv"

STOPPED = "stopped"


def stop_config_thread() -> str:
    """Stop and join Kineto's config thread (a no-op where it is not running). Returns
    ``"stopped"``, or why it was left as it is; never raises."""
    if os.environ.get(ENV_DAEMON, "").strip():
        return f"left running: {ENV_DAEMON} is set (the dynolog daemon polls through it)"
    path = loaded_library(LIBRARY)
    if path is None:
        return f"left as it is: {LIBRARY} is not loaded"
    try:
        import ctypes

        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        instance, stop = lib[INSTANCE], lib[STOP_THREAD]
        instance.restype, instance.argtypes = ctypes.c_void_p, []
        stop.restype, stop.argtypes = None, [ctypes.c_void_p]
        loader = instance()
        if not loader:
            return "left as it is: no ConfigLoader"
        stop(loader)
    except (OSError, AttributeError) as err:  # a torch built without Kineto, or stripped
        return f"left as it is: {err}"
    return STOPPED


def loaded_library(name: str, maps: str = "/proc/self/maps") -> str | None:
    """The path of the shared library ``name`` as this process mapped it, or None."""
    try:
        with open(maps) as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and os.path.basename(path) == name:
                    return "/" + path
    except OSError:
        return None
    return None
