#!/usr/bin/env python3
"""receiver.py -- the callback receiver of tools/bench: HTTP/1.1 on 127.0.0.1
with keep-alive, answering every POST 200 {"ok":true} and counting them.

    receiver.py PORT_FILE COUNT_FILE

Binds a free port, writes "PORT PID" to PORT_FILE, and on SIGTERM writes
the number of requests answered to COUNT_FILE and exits.  asyncio, one
process: cheap enough not to be what the bench measures (tools/fake-receiver
is the test receiver with modes and signature checks; it answers HTTP/1.0,
one connection per callback).
"""
import asyncio
import os
import signal
import sys

BODY = b'{"ok":true}'
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
          + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class Counter:
    n = 0


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            if length:
                await reader.readexactly(length)
            Counter.n += 1
            writer.write(ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port_file, count_file):
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    port = server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (port, os.getpid()))
    os.rename(tmp, port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    with open(count_file, "w") as f:
        f.write("%d\n" % Counter.n)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
