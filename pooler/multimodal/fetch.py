"""Fetch an image over http(s) for a server, within size and time limits, never from a private
address.

The host is resolved once and the connection goes to that address (the Host header and TLS
name stay the URL's), so a DNS answer cannot change between the check and the connect.
Loopback, private, link-local (cloud metadata at 169.254.169.254), multicast, reserved and
unspecified addresses are refused unless `allow_private` is set. Redirects are followed up to
`max_redirects`, each target checked the same way. The server wires this in (the lead's HTTP
routes); the offline API takes files, bytes and data URLs (pooler/multimodal/media.py).
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

from pooler.multimodal.media import DEFAULT_LIMITS, ImageInputError


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a resolved address, verifying the certificate for the URL's host."""

    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def fetch_image_bytes(url: str, index: int = 0, *, max_bytes: int = DEFAULT_LIMITS.max_bytes,
                      timeout: float = 10.0, max_redirects: int = 3,
                      allow_private: bool = False, field: str = "inputs") -> bytes:
    """The body of an http(s) URL, at most `max_bytes`, within `timeout` seconds in all."""
    where = f"{field}[{index}]"
    deadline = time.monotonic() + timeout
    for _ in range(max_redirects + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImageInputError(f"{where}: {url[:100]!r} is not an http(s) URL.")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = _resolve(parts.hostname, port, allow_private, where)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ImageInputError(f"{where}: fetching the image took longer than {timeout} s.")
        if parts.scheme == "https":
            conn = _PinnedHTTPSConnection(address, parts.hostname, port, remaining)
        else:
            conn = http.client.HTTPConnection(address, port, timeout=remaining)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        watchdog = None
        try:
            conn.connect()
            # Socket timeouts bound each receive, not the whole: a server that drips its
            # headers or body a byte at a time is cut off at the deadline.
            # (the socket itself: http.client hands it to the response and forgets it).
            watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), _cut,
                                       (conn.sock,))
            watchdog.daemon = True
            watchdog.start()
            conn.request("GET", path, headers={"Host": parts.netloc, "User-Agent": "pooler",
                                               "Accept": "image/*"})
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                if not location:
                    raise ImageInputError(f"{where}: a redirect without a Location.")
                url = urljoin(url, location)
                continue
            if response.status != 200:
                raise ImageInputError(f"{where}: fetching {url[:100]!r} answered HTTP "
                                      f"{response.status}.")
            return _read_limited(response, max_bytes, deadline, timeout, where)
        except (socket.timeout, TimeoutError):
            raise ImageInputError(f"{where}: fetching the image took longer than "
                                  f"{timeout} s.") from None
        except (OSError, http.client.HTTPException) as exc:
            if time.monotonic() >= deadline:  # cut off by the watchdog
                raise ImageInputError(f"{where}: fetching the image took longer than "
                                      f"{timeout} s.") from None
            raise ImageInputError(f"{where}: fetching {url[:100]!r} failed ({exc}).") from None
        finally:
            if watchdog is not None:
                watchdog.cancel()
            conn.close()
    raise ImageInputError(f"{where}: more than {max_redirects} redirects.")


def _cut(sock) -> None:
    """Wake a receive blocked on `sock` (shutdown does; close alone may not)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _resolve(host: str, port: int, allow_private: bool, where: str) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ImageInputError(f"{where}: the host {host!r} does not resolve.") from None
    addresses = [info[4][0] for info in infos]
    if not allow_private:
        refused = [a for a in addresses if not is_public_address(a)]
        if refused:
            raise ImageInputError(f"{where}: {host!r} resolves to a private or local address "
                                  f"({refused[0]}); image URLs must be public.")
    return addresses[0]


def _read_limited(response, max_bytes: int, deadline: float, timeout: float,
                  where: str) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ImageInputError(f"{where}: the image is {declared} bytes, over the limit of "
                              f"{max_bytes} bytes.")
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise ImageInputError(f"{where}: fetching the image took longer than {timeout} s.")
        chunk = response.read(64 * 1024)
        if not chunk:
            if time.monotonic() >= deadline:  # the watchdog ended it, not the server
                raise ImageInputError(f"{where}: fetching the image took longer than "
                                      f"{timeout} s.")
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ImageInputError(f"{where}: the image is over the limit of {max_bytes} bytes.")
        chunks.append(chunk)
