"""A TCP relay on loopback between the store's clients and its server, that a test cuts:

    relay = Relay(target_port)     # listens on relay.port, forwards to target_port
    relay.down()                   # refuses new connections and resets open ones
    relay.down("reset")            # accepts, then resets at once (a front end going away)
    relay.up()                     # forwards again
    relay.drop_reply(b"DELETE ")   # the next request holding these bytes reaches the server,
                                   # its answer does not reach the client (a lost reply)
    relay.close()

Refusing is the kernel's own: the listening socket is closed, so a client's connect
fails with ECONNREFUSED; a reset is a close with SO_LINGER 0 (RST), as a peer that drops
the connection.
"""

from __future__ import annotations

import socket
import struct
import threading


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class Relay:
    def __init__(self, target_port: int, port: int = 0):
        self.target = ("127.0.0.1", target_port)
        self.mode = "up"  # or "refuse", "reset"
        self.dropped = 0  # answers dropped (drop_reply)
        self._marker: bytes | None = None
        self._doomed: set[socket.socket] = set()  # servers whose next answer is dropped
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: down("refuse") or close()
                return
            if self.mode != "up":
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b, a is client), daemon=True).start()

    def _pipe(self, source: socket.socket, dest: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if upstream and self._marker is not None and self._marker in data:
                        self._marker = None
                        self._doomed.add(dest)
                    if not upstream and source in self._doomed:
                        self._doomed.discard(source)
                        self.dropped += 1
                        for sock in (dest, source):  # at once: the other pipe's recv returns
                            sock.shutdown(socket.SHUT_RDWR)
                        raise OSError("the answer is dropped")
                dest.sendall(data)
            dest.shutdown(socket.SHUT_WR)
        except OSError:  # one end reset: the other is reset too, as a real peer's would be
            with self._lock:
                self._open.difference_update((source, dest))
            _reset(source)
            _reset(dest)

    def _cut_open(self) -> None:
        with self._lock:
            open_, self._open = list(self._open), set()
        for sock in open_:
            _reset(sock)

    def down(self, mode: str = "refuse") -> None:
        with self._lock:
            self.mode = mode
            if mode == "refuse" and self._listener is not None:
                self._listener.close()
                self._listener = None
        self._cut_open()

    def up(self) -> None:
        with self._lock:
            self.mode = "up"
            if self._listener is None:
                self._listen()

    def drop_reply(self, marker: bytes) -> None:
        """The next request whose bytes hold `marker` reaches the server, which acts on
        it; as its answer comes, both connections are reset (a timeout's effect)."""
        with self._lock:
            self._marker = marker

    def close(self) -> None:
        self.down()
