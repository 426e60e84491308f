"""The team store: report files in S3-compatible object storage and a shared catalog in PostgreSQL,
each run its owner's unless shared (docs/team-store.md).

It stands beside the embedded store (a folder and SQLite, :mod:`fleet.store`), which stays the
default and the truth on each person's machine: a finished run is pushed from there (:mod:`.push`),
and one that could not be pushed stays there, said, until ``fleet reports push`` sends it.

One concern a module: ``config`` (which team store: options, environment, site file) -> ``schema``
(the SQL: tables, row-level security, the object-address signer) -> ``catalog`` (PostgreSQL) and
``objects`` (S3) -> ``push`` (a run up) and ``read`` (runs and files back down).
"""
