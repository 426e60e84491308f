"""Many simulated SSH hosts served by one asyncssh process, for bench/scale.py.

Listens on ``--port`` of every address in ``--addresses`` (a file, one per line), with one host
key for all of them and the one user key in ``--authorized-key``. An exec request of
``python3 -c ...`` is answered as fleet's agent would answer ``fleet probe``: the bundle is read
from stdin to its end, a canned JSON document (``--reply``) is written on stdout, status 0.
The client does all its real work (connect, key exchange, host key check, authentication, the
bundle on stdin, reading, parsing); only the agent's own run on the node is left out.

Writes "ready" on stdout once every address listens; on SIGTERM, one JSON line of counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
from pathlib import Path

import asyncssh

COUNTS = {"connections": 0, "sessions": 0, "bundle_bytes": 0, "refused": 0}


class Server(asyncssh.SSHServer):
    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        COUNTS["connections"] += 1


def handler(reply: bytes):
    async def session(process: asyncssh.SSHServerProcess) -> None:
        COUNTS["sessions"] += 1
        if not (process.command or "").startswith("python3 -c "):
            COUNTS["refused"] += 1
            process.exit(127)
            return
        got = 0
        while chunk := await process.stdin.read(65536):
            got += len(chunk)
        COUNTS["bundle_bytes"] += got
        process.stdout.write(reply)
        process.exit(0)

    return session


async def serve(a: argparse.Namespace) -> None:
    addresses = a.addresses.read_text().split()
    reply = a.reply.read_bytes()
    servers = []
    for address in addresses:  # one listening socket per simulated host, as a real fleet has
        servers.append(await asyncssh.listen(
            address, a.port, server_host_keys=[str(a.host_key)], authorized_client_keys=str(a.authorized_key),
            server_factory=Server, process_factory=handler(reply), encoding=None, backlog=1024,
            reuse_address=True))
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for s in servers:
        s.close()
    print(json.dumps(COUNTS), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addresses", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host-key", type=Path, required=True)
    ap.add_argument("--authorized-key", type=Path, required=True)
    ap.add_argument("--reply", type=Path, required=True)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process only: a socket per host and per client
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        asyncio.run(serve(a))
    except KeyboardInterrupt:
        sys.exit(1)


if __name__ == "__main__":
    main()
