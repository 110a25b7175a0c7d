"""Whether a TLS server asks for a client certificate, read from its handshake.

gRPC reports a router under mTLS that refused us (no certificate, or one from another CA) only
as ``Socket closed``: the router's TLS stack hangs up without an alert the client could read.
The answer is in the handshake: a server that wants a certificate sends a CertificateRequest.
TLS 1.3 encrypts that message, so the probe offers TLS 1.2 alone, whose handshake stays
plaintext up to the server's ServerHelloDone (gRPC servers take TLS 1.2 and 1.3). It sends
its ClientHello, reads the server's first flight and hangs up: no certificate of ours, no data.
"""

from __future__ import annotations

import socket
import ssl

_HANDSHAKE_RECORD = 22  # a TLS record's content type
_CERTIFICATE_REQUEST, _SERVER_HELLO_DONE = 13, 14  # handshake message types
_RECORD_HEADER_LEN, _MESSAGE_HEADER_LEN = 5, 4


def asks_for_client_cert(address: str, timeout_s: float = 2.0) -> bool:
    """True when the server at ``host:port`` sends a CertificateRequest; False when it does
    not, or when the probe cannot tell (no answer, TLS 1.3 only, an address it cannot
    parse)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(_client_hello(host))
            return _CERTIFICATE_REQUEST in _server_flight_types(sock)
    except (OSError, ValueError):
        return False


def _client_hello(host: str) -> bytes:
    """A TLS 1.2 ClientHello as Python's ssl writes it. The handshake stops there: nothing of
    the reply goes through ssl, so nothing is verified or trusted."""
    context = ssl.create_default_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])  # gRPC servers refuse a client that offers no h2
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=host)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # the ClientHello is written; it waits for the reply
        pass
    return outgoing.read()


def _server_flight_types(sock: socket.socket) -> list[int]:
    """The types of the server's handshake messages, up to its ServerHelloDone or its close."""
    received = b""
    types: list[int] = []
    while _SERVER_HELLO_DONE not in types:
        chunk = sock.recv(16384)
        if not chunk:
            break
        received += chunk
        types = handshake_types(received)
    return types


def handshake_types(records: bytes) -> list[int]:
    """The message types in the handshake records of ``records`` (a prefix of a TLS 1.2
    stream: a record or a message cut short at its end still names its type)."""
    body, at = b"", 0
    while at + _RECORD_HEADER_LEN <= len(records):
        content_type = records[at]
        length = int.from_bytes(records[at + 3 : at + _RECORD_HEADER_LEN], "big")
        start = at + _RECORD_HEADER_LEN
        if content_type == _HANDSHAKE_RECORD:  # messages may span records: join their bodies
            body += records[start : start + length]
        at = start + length
    types, at = [], 0
    while at + _MESSAGE_HEADER_LEN <= len(body):
        types.append(body[at])
        at += _MESSAGE_HEADER_LEN + int.from_bytes(body[at + 1 : at + 4], "big")
    return types
