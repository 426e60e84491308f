"""fleet's known_hosts lookup gives, for every host, what asyncssh's own lookup of the whole file
gives: plain, comma-separated, hashed (HashKnownHosts yes), wildcard and negated names, markers,
and the fallback to the name without the port."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import asyncssh
import pytest

from fleet.transport.known_hosts import RunKnownHosts


def key_text() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


KEYS = [key_text() for _ in range(8)]
TEXT = "\n".join([
    f"10.0.0.1 {KEYS[0]}",
    f"[10.0.0.1]:2222 {KEYS[1]}",
    f"node2,10.0.0.2 {KEYS[2]}",
    f"{hashed('[10.0.0.3]:2222')} {KEYS[3]}",
    f"{hashed('10.0.0.4')} {KEYS[4]}",
    f"@revoked {hashed('10.0.0.4')} {KEYS[5]}",
    f"*.lab,!bad.lab {KEYS[6]}",
    f"@cert-authority 10.0.0.* {KEYS[7]}",
    "# a comment",
    "",
    f"{hashed('10.0.0.9')} {KEYS[0]}",
])

CASES = [("10.0.0.1", "10.0.0.1", 2222), ("10.0.0.1", "10.0.0.1", 22), ("10.0.0.1", "10.0.0.1", None),
         ("node2", "10.0.0.2", 2222), ("10.0.0.3", "10.0.0.3", 2222), ("10.0.0.3", "10.0.0.3", None),
         ("10.0.0.4", "10.0.0.4", 2200), ("a.lab", "10.1.0.1", None), ("bad.lab", "10.1.0.2", None),
         ("10.0.0.7", "10.0.0.7", 22), ("unknown", "192.0.2.1", 2222), ("10.0.0.9", "10.0.0.9", 22)]


def fingerprints(result: tuple) -> list:
    return [sorted(k.public_data for k in part) for part in result[:3]] + [len(part) for part in result[3:]]


@pytest.mark.parametrize("host,addr,port", CASES)
def test_same_answer_as_asyncssh(host, addr, port):
    ours = RunKnownHosts(TEXT)
    theirs = asyncssh.import_known_hosts(TEXT)
    assert fingerprints(ours.match(host, addr, port)) == fingerprints(theirs.match(host, addr, port))
    assert fingerprints(ours(host, addr, port)) == fingerprints(theirs.match(host, addr, port))


def test_the_cases_cover_found_revoked_and_missing():
    theirs = asyncssh.import_known_hosts(TEXT)
    found = [theirs.match(*case) for case in CASES]
    assert any(r[0] for r in found) and any(r[1] for r in found) and any(r[2] for r in found)
    assert any(not (r[0] or r[1]) for r in found)
