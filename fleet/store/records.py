"""The records a manifest is made of, read back from its JSON: only a record's own keys are
taken (the others keep their defaults), and what is not a JSON object is a ``ManifestError``; a
run's id."""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, fields
from typing import Any

from ..errors import FleetError


def new_run_id() -> str:
    """A run's id: when it began, and four hex digits against two runs in one second."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class ManifestError(FleetError, ValueError):
    """A manifest fleet cannot read: not one, or written by a newer fleet."""


def known_fields(cls, doc: Any, what: str) -> dict:
    """The keys of ``doc`` that are fields of ``cls`` (the others take their defaults)."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} is not a JSON object: {doc!r:.80}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


class Record:
    """A dataclass that reads its JSON back, keeping only its own keys."""
    WHAT = "a record"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict):
        return cls(**known_fields(cls, doc, cls.WHAT))
