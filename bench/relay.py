"""A counting TCP relay on loopback: bytes on the wire between a client and a server, both directions.

The bench points an agent at the relay's port instead of the server's; the relay forwards every byte
unchanged (TLS stays end to end, so the count includes handshakes, certificates, tickets and record
overhead, but not TCP/IP headers) and counts what went up (client to server) and down. It runs its
own asyncio loop in a thread of the bench process, so its CPU is never charged to the server.
Used by bench/fleet.py and bench/run.py; stdlib only.
"""
import asyncio, socket, threading, time


class CountingRelay:
    """127.0.0.1:<port> -> 127.0.0.1:<target_port>; `snapshot()` reads the counters."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.up = 0
        self.down = 0
        self.connections = 0
        self.active = 0
        self.port = None
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._thread = None

    def start(self):
        ready = threading.Event()

        def main():
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self):
        def close():
            self._server.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(close)
        self._thread.join(10)

    def snapshot(self, settle=10.0):
        """(up, down, connections) once no connection is open (the client has exited and the server
        has answered its close), waiting at most `settle` seconds."""
        end = time.monotonic() + settle
        while self.active and time.monotonic() < end:
            time.sleep(0.005)
        return self.up, self.down, self.connections

    @staticmethod
    def _nodelay(writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def _pipe(self, reader, writer, up):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            # A reset on one side: close the other, so its reader ends too.
            writer.close()

    async def _handle(self, creader, cwriter):
        self.active += 1
        self.connections += 1
        swriter = None
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._nodelay(cwriter)
            self._nodelay(swriter)
            await asyncio.gather(self._pipe(creader, swriter, True), self._pipe(sreader, cwriter, False))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (cwriter, swriter):
                if w is not None:
                    w.close()
                    try:
                        await w.wait_closed()
                    except (ConnectionError, OSError):
                        pass
            self.active -= 1
