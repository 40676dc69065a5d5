"""Image URLs: private addresses refused, size and time limits, redirects (a local server)."""
from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from pooler.multimodal.fetch import fetch_image_bytes, is_public_address
from pooler.multimodal.media import ImageInputError, decode_bytes

buffer = io.BytesIO()
Image.new("RGB", (8, 6), (1, 2, 3)).save(buffer, format="PNG")
PNG = buffer.getvalue()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/image.png")
            self.end_headers()
        elif self.path == "/image.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
        elif self.path == "/big-undeclared":  # no Content-Length: the stream is counted
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif self.path == "/slow":
            time.sleep(1.5)
            self.send_response(200)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.9", "169.254.169.254",
                                     "::1", "fc00::1", "fe80::1", "0.0.0.0", "224.0.0.1",
                                     "::ffff:127.0.0.1"])
def test_private_and_local_addresses_are_not_public(address):
    assert not is_public_address(address)


def test_public_addresses_are():
    assert is_public_address("8.8.8.8") and is_public_address("2001:4860:4860::8888")


def test_local_server_is_refused_by_default(server):
    with pytest.raises(ImageInputError, match=r"inputs\[2\]: '127.0.0.1' resolves to a private"):
        fetch_image_bytes(server + "/image.png", 2)


def test_fetch_follows_redirects_and_decodes(server):
    data = fetch_image_bytes(server + "/redirect", allow_private=True)
    assert data == PNG and decode_bytes(data).size == (8, 6)


def test_limits(server):
    with pytest.raises(ImageInputError, match="over the limit of 20 bytes"):
        fetch_image_bytes(server + "/image.png", max_bytes=20, allow_private=True)
    with pytest.raises(ImageInputError, match="over the limit of 1000 bytes"):
        fetch_image_bytes(server + "/big-undeclared", max_bytes=1000, allow_private=True)
    with pytest.raises(ImageInputError, match="took longer than 0.3 s"):
        fetch_image_bytes(server + "/slow", timeout=0.3, allow_private=True)
    with pytest.raises(ImageInputError, match="answered HTTP 404"):
        fetch_image_bytes(server + "/missing", allow_private=True)
    with pytest.raises(ImageInputError, match="is not an http"):
        fetch_image_bytes("file:///etc/passwd")
