"""Sampled stacks of the trainer's training thread, classified into phases.

* :mod:`.phases`: the frame tables, one per framework, and ``classify`` (pure);
* :mod:`.aggregate`: a process's samples summed into per-second records, ``<run>/stacks/``;
* :mod:`.inproc`: the sampler ``stallscope run`` injects into the trainer (no ptrace);
* :mod:`.pyspy`: py-spy attached from outside (``run --pid``);
* :mod:`.source`: the collector's view, phase shares per process for ``top``, alerts and
  ``/metrics``.

This package's ``__init__`` imports nothing, so the injected start-up stays light.
"""
