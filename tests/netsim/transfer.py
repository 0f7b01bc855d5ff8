#!/usr/bin/env python3
"""A bounded TCP transfer, to measure a link of scripts/netsim.sh.

  transfer.py recv --bind ADDR --port P --bytes N --timeout S
      accepts one connection, reads until N bytes or EOF, prints one JSON
      line {"bytes": ..., "seconds": ..., "mbit_s": ...}; the time runs from
      the first byte to the last, so connection set-up is not counted. Says
      "listening" on stdout first, so a caller can start the sender then.
  transfer.py send --to ADDR --port P --bytes N --timeout S
      connects once and sends N bytes (zeros).

Everything is bounded: one connection, N bytes, and a socket timeout of S
seconds on every call plus an overall deadline of S seconds. Exit 0 when all
N bytes moved, 1 otherwise (the reason on stderr).
"""

import argparse
import json
import socket
import sys
import time

CHUNK = 64 * 1024


def recv(args):
    deadline = time.monotonic() + args.timeout
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((args.bind, args.port))
        srv.listen(1)
        srv.settimeout(args.timeout)
        print("listening", flush=True)
        conn, _ = srv.accept()
    got = 0
    first = last = None
    with conn:
        conn.settimeout(args.timeout)
        while got < args.bytes:
            if time.monotonic() > deadline:
                print(f"transfer: deadline after {got} bytes", file=sys.stderr)
                break
            data = conn.recv(min(CHUNK, args.bytes - got))
            if not data:
                break
            now = time.monotonic()
            if first is None:
                first = now
                first_len = len(data)
            last = now
            got += len(data)
    seconds = (last - first) if first is not None else 0.0
    # The first read's bytes arrived at `first`: they are not part of the rate.
    timed = got - first_len if first is not None else 0
    mbit_s = timed * 8 / seconds / 1e6 if seconds > 0 else 0.0
    print(json.dumps({"bytes": got, "seconds": round(seconds, 4),
                      "mbit_s": round(mbit_s, 2)}), flush=True)
    if got != args.bytes:
        print(f"transfer: received {got} of {args.bytes} bytes", file=sys.stderr)
        return 1
    return 0


def send(args):
    deadline = time.monotonic() + args.timeout
    buf = bytes(CHUNK)
    sent = 0
    with socket.create_connection((args.to, args.port), timeout=args.timeout) as s:
        while sent < args.bytes:
            if time.monotonic() > deadline:
                print(f"transfer: deadline after {sent} bytes", file=sys.stderr)
                return 1
            n = min(CHUNK, args.bytes - sent)
            s.sendall(buf[:n])
            sent += n
        s.shutdown(socket.SHUT_WR)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    for q in (r, s):
        q.add_argument("--port", type=int, required=True)
        q.add_argument("--bytes", type=int, required=True)
        q.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    try:
        return recv(args) if args.mode == "recv" else send(args)
    except OSError as e:
        print(f"transfer: {args.mode}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
