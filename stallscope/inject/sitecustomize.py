"""Started by Python in every process of a training that ``stallscope run`` launched (this
folder is put first on the trainer's ``PYTHONPATH``): starts the in-process stack sampler
(:mod:`stallscope.sources.stacks.inproc`) and, for Keras, whose input wait runs where stacks
cannot see it, adds the probe's callback to ``model.fit``
(:mod:`stallscope.integrations.autokeras`); records the last line of an uncaught exception in
``<run>/errors.jsonl`` (so a run whose trainer crashed says why: the diagnosis's
``command_failed``); then runs the ``sitecustomize`` this one hides, if any, so the
interpreter's own start-up is unchanged. Never raises."""

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
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            sys.path.append(root)
            from stallscope.sources.stacks.inproc import rate_from_env, start
        start(run_dir, rate_from_env())
        from stallscope.integrations.autokeras import install

        install()
    except Exception as exc:  # one line, never the trainer's problem
        try:
            # the error may quote $STALLSCOPE_RUN_DIR: shown safe for a terminal, clipped
            from stallscope.textsafe import error_text

            sys.stderr.write(
                f"stallscope: no stack sampling in pid {os.getpid()}: "
                f"{error_text(f'{type(exc).__name__}: {exc}')}\n"
            )
        except Exception:
            pass


#: the longest error line kept (a message can quote a whole tensor)
_MAX_ERROR = 500


def _record_errors() -> None:
    """Chain ``sys.excepthook``: an uncaught exception's last line ("ModuleNotFoundError: No
    module named 'torch'") is appended to ``<run>/errors.jsonl`` with its time and pid, then
    the interpreter's own hook prints the traceback as always."""
    run_dir = os.environ.get("STALLSCOPE_RUN_DIR")
    if not run_dir:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):  # type: ignore[no-untyped-def]
        try:
            import json
            import time

            line = "".join(
                ch
                for ch in f"{kind.__name__}: {value}".splitlines()[0][:_MAX_ERROR]
                if ch.isprintable()
            )
            rec = json.dumps({"ts": time.time(), "pid": os.getpid(), "error": line})
            fd = os.open(
                os.path.join(run_dir, "errors.jsonl"),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                0o644,
            )
            try:
                os.write(fd, (rec + "\n").encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except Exception:
            pass  # never the trainer's problem
        previous(kind, value, tb)

    sys.excepthook = hook


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
_record_errors()
_chain()
