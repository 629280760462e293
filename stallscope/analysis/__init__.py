"""Analysis: what a recorded run means.

One reader (:mod:`stallscope.analysis.rundata`) loads a run once per command into a
:class:`RunData`; process roles are inferred in one place (:mod:`stallscope.sources.roles`);
the summary (:mod:`stallscope.analysis.summary`) and the diagnosis
(:mod:`stallscope.analysis.diagnose`) are pure functions of it. They read only what the run
recorded, never the machine they run on.
"""

from __future__ import annotations

from stallscope.analysis.rundata import RunData, load_run

__all__ = ["RunData", "load_run"]
