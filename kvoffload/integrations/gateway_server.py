"""The gateway's listening side: a thread per connection, at most ``max_connections`` of them.

Past the bound a new connection is answered 503 at once and closed (a client still sending its
request then may see a reset instead), so a flood of idle or slow clients cannot start threads
without end; each connection's request must arrive whole
within the gateway's timeout (``gateway_http``), so none holds its thread for long either.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("kvoffload.gateway")

#: Connections served at once; more are answered 503.
MAX_CONNECTIONS = 256


def _busy_answer(limit: int) -> bytes:
    body = json.dumps({"error": f"the gateway is serving {limit} connections (--max-connections): retry shortly"})
    return (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\nRetry-After: 1\r\n\r\n{body}").encode()


class GatewayServer(ThreadingHTTPServer):
    """A client that leaves (a reset or a closed pipe, e.g. a keep-alive connection its pool
    dropped) ends its connection and nothing else: the standard server printed a traceback to
    stderr for each, which buried the gateway's own errors. Anything else is logged once, with
    its cause."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int = MAX_CONNECTIONS) -> None:
        if type(max_connections) is not int or not 1 <= max_connections <= 65536:
            raise ValueError(f"--max-connections {max_connections}: give a count from 1 to 65536, e.g. 256")
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._busy_logged = False
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if not self._busy_logged:
                self._busy_logged = True
                logger.warning("kvoffload gateway: %d connections at once; further ones are answered 503 "
                               "(--max-connections; logged once)", self.max_connections)
            try:
                request.setblocking(False)
                request.send(_busy_answer(self.max_connections))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, socket.timeout)):
            logger.debug("client %s left: %s", client_address, exc)
            return
        logger.error("gateway: request from %s failed", client_address, exc_info=True)
