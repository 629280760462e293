"""Started by Python in every process of a training that ``stallscope run`` launched (this
folder is put first on the trainer's ``PYTHONPATH``): starts the in-process stack sampler
(:mod:`stallscope.sources.stacks.inproc`) and, for Keras, whose input wait runs where stacks
cannot see it, adds the probe's callback to ``model.fit``
(:mod:`stallscope.integrations.autokeras`); then runs the ``sitecustomize`` this one hides, if
any, so the interpreter's own start-up is unchanged. Never raises."""

import os
import sys


def _start_sampler() -> None:
    run_dir = os.environ.get("STALLSCOPE_RUN_DIR")
    rate = os.environ.get("STALLSCOPE_STACKS_HZ")
    if not run_dir or not rate:
        return
    try:
        try:
            from stallscope.sources.stacks.inproc import rate_from_env, start
        except ImportError:  # a Python without stallscope installed: use this copy
            root = os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(__file__))))
            sys.path.append(root)
            from stallscope.sources.stacks.inproc import rate_from_env, start
        start(run_dir, rate_from_env())
        from stallscope.integrations.autokeras import install

        install()
    except Exception as exc:  # one line, never the trainer's problem
        try:
            # the error may quote $STALLSCOPE_RUN_DIR: shown safe for a terminal, clipped
            from stallscope.textsafe import error_text

            sys.stderr.write(f"stallscope: no stack sampling in pid {os.getpid()}: "
                             f"{error_text(f'{type(exc).__name__}: {exc}')}\n")
        except Exception:
            pass


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path (Debian's, a virtualenv's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        try:
            sys.stderr.write(f"stallscope: the trainer's own sitecustomize failed: {exc}\n")
        except Exception:
            pass


_start_sampler()
_chain()
