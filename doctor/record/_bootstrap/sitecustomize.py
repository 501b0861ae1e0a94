# doctor's bootstrap: `doctor run` puts this folder first on PYTHONPATH so that every Python
# process of the job starts a doctor Session before user code runs. It imports nothing from the
# user's directory, never raises, and then runs the sitecustomize it shadows, if there is one.
#
# doctor's code runs inside the job under a private package name (PRIVATE), loaded from
# doctor's own folders, so that `doctor` is never in the job's sys.modules: a project with its
# own package or module named `doctor` imports its own. Nothing heavy is imported here (no
# numpy, torch or pandas): the probes start once the job imports torch.
# The file parses on any Python from 2.7 (no annotations, no f-strings): a Python 2 child of the
# job runs it too, and a syntax error here would print "'import sitecustomize' failed" into the
# job's output. It names RUN_DIR/bootstrap-errors itself (doctor.store.layout.BOOTSTRAP_ERRORS):
# it writes there when doctor cannot be imported at all.
PRIVATE = "_doctor_job"  # doctor.record.session.PRIVATE_PACKAGE says the same
ENV_PROBES_DIR = "DOCTOR_PROBES_DIR"  # doctor.launch sets it: where doctor.probes lives


def _doctor_bootstrap():
    # type: () -> None
    import os

    if not os.environ.get("DOCTOR_RUN_DIR"):
        return
    try:
        import importlib

        _install_private_package()
        importlib.import_module(PRIVATE + ".bootstrap").start_from_env()
    except BaseException as err:
        try:
            run_dir = os.environ["DOCTOR_RUN_DIR"]
            os.makedirs(os.path.join(run_dir, "bootstrap-errors"), exist_ok=True)
            path = os.path.join(run_dir, "bootstrap-errors", "{}.txt".format(os.getpid()))  # noqa: UP032
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write("{}: {}\n".format(type(err).__name__, err))  # noqa: UP032 (Python 2)
        except OSError:
            pass


def _install_private_package():
    # type: () -> None
    """Make PRIVATE a package over doctor's folder (its __init__, the public API, is not run)
    and over the folder that holds doctor.probes: the in-job modules import each other
    relatively, so they load as PRIVATE.* from doctor's own files, without a finder of ours."""
    import importlib.machinery
    import os
    import sys

    if PRIVATE in sys.modules:
        return
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probes_dir = os.environ.get(ENV_PROBES_DIR, "")
    if not os.path.isfile(os.path.join(probes_dir, "__init__.py")):
        # an installed doctor has doctor/probes; a source checkout has probes/ beside doctor/
        probes_dir = os.path.join(package_dir, "probes")
        if not os.path.isdir(probes_dir):
            probes_dir = os.path.join(os.path.dirname(package_dir), "probes")
    path = [package_dir]
    if os.path.basename(probes_dir) == "probes" and os.path.dirname(probes_dir) != package_dir:
        path.append(os.path.dirname(probes_dir))
    spec = importlib.machinery.ModuleSpec(PRIVATE, None, is_package=True)
    spec.submodule_search_locations = path
    module = type(sys)(PRIVATE)
    module.__spec__ = spec
    module.__path__ = path
    module.__package__ = PRIVATE
    sys.modules[PRIVATE] = module


def _chain_to_shadowed_sitecustomize():
    # type: () -> None
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


def _chain_on_an_old_python():
    # type: () -> None
    """A Python 2 (or 3 before 3.5) child of the job: doctor records nothing there, and runs
    the sitecustomize it shadows, if there is one, as that Python would have."""
    import imp
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        found = imp.find_module("sitecustomize", rest)
    except ImportError:
        return
    try:
        imp.load_module("sitecustomize", *found)  # type: ignore[arg-type]
    finally:
        if found[0] is not None:
            found[0].close()


def _main():
    # type: () -> None
    import sys

    if sys.version_info < (3, 5):  # noqa: UP036  (the job's children: any Python)
        _chain_on_an_old_python()
        return
    _doctor_bootstrap()
    _chain_to_shadowed_sitecustomize()


_main()
