"""The floor for bench/fanout.py: the least an asyncssh client can do.

One connection per host, one command, asyncio.gather under a semaphore;
known_hosts loaded once, no ssh_config (config=None), asyncssh's default
algorithms. Prints ``host: line`` for each line of output, like pdsh.

    bare_asyncssh.py --port 2222 --user fleetci --key KEY --known-hosts FILE \
        -c 64 --hosts 127.0.0.1,127.0.0.2 -- COMMAND
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import asyncssh


async def main(args: argparse.Namespace) -> int:
    hosts = [h for h in args.hosts.split(",") if h]
    known = asyncssh.read_known_hosts(args.known_hosts)
    limit = asyncio.Semaphore(args.concurrency)
    command = " ".join(args.command)
    out = sys.stdout

    async def one(host: str) -> int:
        async with limit:
            try:
                async with asyncssh.connect(host, port=args.port, username=args.user, client_keys=[args.key],
                                            known_hosts=known, config=None) as conn:
                    r = await conn.run(command, check=False)
            except (OSError, asyncssh.Error) as e:
                print(f"{host}: error: {e}", file=sys.stderr)
                return 255
        for line in (r.stdout or "").splitlines():
            out.write(f"{host}: {line}\n")
        return r.exit_status or 0

    statuses = await asyncio.gather(*(one(h) for h in hosts))
    return max(statuses, default=0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", required=True, help="comma-separated addresses")
    p.add_argument("--port", type=int, default=22)
    p.add_argument("--user", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--known-hosts", required=True)
    p.add_argument("-c", "--concurrency", type=int, default=64)
    p.add_argument("--show-kex", action="store_true", help="log the negotiated key exchange (stderr)")
    p.add_argument("command", nargs="+")
    a = p.parse_args()
    if a.show_kex:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
        asyncssh.set_debug_level(2)
    sys.exit(asyncio.run(main(a)))
