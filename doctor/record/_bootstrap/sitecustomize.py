# doctor's bootstrap: `doctor run` puts this folder first on PYTHONPATH so that every Python
# process of the job starts a doctor Session before user code runs. It imports nothing from the
# user's directory, never raises, and then runs the sitecustomize it shadows, if there is one.
# It names RUN_DIR/bootstrap-errors itself (doctor.store.layout.BOOTSTRAP_ERRORS): it writes there
# when doctor cannot be imported at all.
def _doctor_bootstrap() -> None:
    import os

    if not os.environ.get("DOCTOR_RUN_DIR"):
        return
    try:
        from doctor.record import bootstrap as boot

        boot.start_from_env()
    except BaseException as err:
        try:
            run_dir = os.environ["DOCTOR_RUN_DIR"]
            os.makedirs(os.path.join(run_dir, "bootstrap-errors"), exist_ok=True)
            path = os.path.join(run_dir, "bootstrap-errors", f"{os.getpid()}.txt")
            with open(path, "w") as f:
                f.write(f"{type(err).__name__}: {err}\n")
        except OSError:
            pass


def _chain_to_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_doctor_bootstrap()
_chain_to_shadowed_sitecustomize()
