"""Slurm: the batch script (``script``, ``launchers``), the cluster (``cluster``), Slurm's
commands (``jobs``) and one profiled job from submission to the store (``run``)."""
