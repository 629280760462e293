"""Run several stallscope commands in one interpreter, each as `python -m stallscope` would
run it: its own stdout and stderr (file descriptors 1 and 2, so whatever writes there is
caught), its exit code, and an exception that escapes the CLI printed as Python prints one at
exit (a ``Traceback``), exit code 1.

A fault corpus runs a few hundred short commands; started one interpreter each, their imports
and the report's first plot (matplotlib's import and font cache) were most of its time
(tests/scenarios/test_corrupt_runs.py). Each command works on its own run folder.

    python tests/cli_batch.py JOBS.json RESULTS.json

JOBS.json: ``[[label, cwd, [arg, ...]], ...]``; RESULTS.json: ``{label: [rc, stdout, stderr]}``,
written after each command, so a batch that hangs or dies still leaves those before it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback


def _run(argv: list[str]) -> int:
    from stallscope.cli import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse, or a command that exits
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter would print, had the command run alone
        traceback.print_exc()
        return 1


def main() -> int:
    jobs_path, results_path = sys.argv[1:3]
    with open(jobs_path) as f:
        jobs = json.load(f)
    results: dict[str, list[object]] = {}
    saved = os.dup(1), os.dup(2)
    for label, cwd, argv in jobs:
        os.chdir(cwd)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                rc = _run(argv)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            texts = []
            for fobj in (out, err):
                fobj.seek(0)
                texts.append(fobj.read().decode("utf-8", "replace"))
        results[label] = [rc, *texts]
        with open(results_path, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
