"""Request vectors for the differential test of the API port's server (issue 19), and how each of three
HTTP/1.1 servers reads them: ours over a real socket, h11 and llhttp (httptools used directly).

A verdict is the requests a server accepted, in order (method and body), and whether it refused
what followed (400/413/431/501/505 from ours, a protocol error from a reference). Bytes left over
that do not yet make a request are neither: a server waits for more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import h11
import httptools

from pd_runtime.proxy.http1 import MAX_HEAD_BYTES

REFUSALS = {400, 413, 431, 501, 505}
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
HIDDEN = b"GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n"


def post(headers: bytes, body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + body


def chunked(body: bytes) -> bytes:
    return post(b"Transfer-Encoding: chunked\r\n", body)


HOST_SYNTAX = (
    'RFC 9110 7.2: Host is uri-host [ ":" port ] (RFC 3986); h11 and llhttp leave its syntax to the application'
)


@dataclass(frozen=True)
class Vector:
    name: str
    data: bytes
    note: str = ""  # where ours refuses less than a reference on purpose, why


VECTORS = [
    # well-formed: everyone accepts these
    Vector("get", GET),
    Vector("post-content-length", post(b"Content-Length: 5\r\n", b"hello")),
    Vector("post-content-length-0", post(b"Content-Length: 0\r\n", b"")),
    Vector("content-length-leading-zeros", post(b"Content-Length: 005\r\n", b"hello")),
    Vector("content-length-trailing-ows", post(b"Content-Length: 5 \r\n", b"hello")),
    Vector("chunked", chunked(b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("chunked-upper-hex", chunked(b"A\r\n0123456789\r\n0\r\n\r\n")),
    Vector("chunked-extension", chunked(b"5;name=value\r\nhello\r\n0\r\n\r\n")),
    Vector("chunked-trailer", chunked(b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n")),
    Vector("chunked-capitalised", post(b"Transfer-Encoding: Chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("http-1.0-without-host", b"GET / HTTP/1.0\r\n\r\n"),
    Vector("absolute-form", b"GET http://x/a?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("query", b"GET /a?b=c HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("obs-text-in-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: caf\xe9\r\n\r\n"),
    Vector("tab-in-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\tb\r\n\r\n"),
    Vector("ows-around-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: \t a \t\r\n\r\n"),
    Vector("repeated-field", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n\r\n"),
    Vector(
        "leading-empty-line",
        b"\r\n" + GET,
        note="RFC 9112 2.2: a server SHOULD ignore an empty line before the request line; h11 refuses it",
    ),
    Vector("expect-100-continue", post(b"Content-Length: 2\r\nExpect: 100-continue\r\n", b"ok")),
    Vector("head-of-60-kib", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (60 * 1024) + b"\r\n\r\n"),
    # bare LF, CR, NUL: RFC 9112 2.2 and RFC 9110 5.5
    Vector("bare-lf-between-fields", b"GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n"),
    Vector("bare-lf-after-the-request-line", b"GET / HTTP/1.1\nHost: x\r\n\r\n"),
    Vector("bare-lf-everywhere", b"GET / HTTP/1.1\nHost: x\n\n"),
    Vector("bare-lf-ends-the-head", b"GET / HTTP/1.1\r\nHost: x\r\n\n"),
    Vector("bare-lf-in-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\nb\r\n\r\n"),
    Vector("bare-lf-after-a-chunk-size", chunked(b"5\nhello\r\n0\r\n\r\n")),
    Vector("bare-lf-after-chunk-data", chunked(b"5\r\nhello\n0\r\n\r\n")),
    Vector("bare-cr-in-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n"),
    Vector("bare-cr-ends-a-field", b"GET / HTTP/1.1\r\nHost: x\rX-A: 1\r\n\r\n"),
    Vector("nul-in-a-value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    Vector("nul-in-a-name", b"GET / HTTP/1.1\r\nHost: x\r\nX\x00A: 1\r\n\r\n"),
    Vector("nul-in-the-target", b"GET /a\x00b HTTP/1.1\r\nHost: x\r\n\r\n"),
    # field syntax
    Vector("obs-fold", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  2\r\n\r\n"),
    Vector("space-before-the-colon", b"GET / HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n"),
    Vector("empty-field-name", b"GET / HTTP/1.1\r\nHost: x\r\n: 1\r\n\r\n"),
    Vector("separator-in-a-name", b"GET / HTTP/1.1\r\nHost: x\r\nX(A): 1\r\n\r\n"),
    Vector("field-line-without-colon", b"GET / HTTP/1.1\r\nHost: x\r\nX-A\r\n\r\n"),
    Vector("space-in-the-target", b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("del-in-the-target", b"GET /a\x7fb HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("method-not-a-token", b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector(
        "unknown-method",
        b"FROB / HTTP/1.1\r\nHost: x\r\n\r\n",
        note="h11 accepts any token as a method; llhttp knows the registered ones",
    ),
    # Content-Length: 1*DIGIT, one value (RFC 9110 8.6, RFC 9112 6.3)
    Vector("content-length-plus", post(b"Content-Length: +5\r\n", b"hello")),
    Vector("content-length-minus", post(b"Content-Length: -5\r\n", b"hello")),
    Vector("content-length-underscore", post(b"Content-Length: 0_5\r\n", b"hello")),
    Vector("content-length-vertical-tab", post(b"Content-Length: 5\x0b\r\n", b"hello")),
    Vector("content-length-list", post(b"Content-Length: 5, 5\r\n", b"hello")),
    Vector("content-length-two-words", post(b"Content-Length: 5 5\r\n", b"hello")),
    Vector("content-length-hex", post(b"Content-Length: 0x5\r\n", b"hello")),
    Vector("content-length-empty", post(b"Content-Length: \r\n", b"")),
    Vector("content-length-overflow", post(b"Content-Length: 99999999999999999999999\r\n", b"x")),
    Vector("content-length-twice-equal", post(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"hello")),
    Vector("content-length-twice-different", post(b"Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!")),
    # chunk sizes: 1*HEXDIG (RFC 9112 7.1)
    Vector("chunk-size-negative", chunked(b"1\r\nA\r\n-6\r\n0\r\n\r\n")),
    Vector("chunk-size-minus-2", chunked(b"-2\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-plus", chunked(b"+5\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-0x", chunked(b"0x5\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-leading-space", chunked(b" 5\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-not-hex", chunked(b"g\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-empty", chunked(b"\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-size-overflow", chunked(b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n")),
    Vector("chunk-data-longer-than-its-size", chunked(b"5\r\nhelloX\r\n0\r\n\r\n")),
    Vector(
        "chunk-extension-of-40-kib",
        chunked(b"5;" + b"e" * (40 * 1024) + b"\r\nhello\r\n0\r\n\r\n"),
        note="ours bounds a chunk-size line at 16 KiB (as Node.js does); the references read any length",
    ),
    # Transfer-Encoding (RFC 9112 6.1, 6.3)
    Vector("te-chunked-twice", post(b"Transfer-Encoding: chunked, chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("te-gzip-chunked", post(b"Transfer-Encoding: gzip, chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("te-gzip", post(b"Transfer-Encoding: gzip\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("te-chunked-gzip", post(b"Transfer-Encoding: chunked, gzip\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("te-identity", post(b"Transfer-Encoding: identity\r\n", b"hello")),
    Vector("te-xchunked", post(b"Transfer-Encoding: xchunked\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    Vector("te-two-fields", post(b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n")),
    Vector("te-in-http-1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    Vector("te-vertical-tab", post(b"Transfer-Encoding:\x0bchunked\r\n", b"5\r\nhello\r\n0\r\n\r\n")),
    # Host (RFC 9112 3.2)
    Vector(
        "host-missing",
        b"GET / HTTP/1.1\r\n\r\n",
        note="llhttp leaves Host to the application",
    ),
    Vector(
        "host-twice",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        note="llhttp leaves Host to the application",
    ),
    Vector("host-ipv6-literal-and-port", b"GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n"),
    Vector("host-empty", b"GET / HTTP/1.1\r\nHost:\r\n\r\n"),
    Vector("host-with-a-space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", note=HOST_SYNTAX),
    Vector("host-with-userinfo", b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", note=HOST_SYNTAX),
    Vector("host-with-two-ports", b"GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", note=HOST_SYNTAX),
    Vector("host-with-a-control-byte", b"GET / HTTP/1.1\r\nHost: a\x01b\r\n\r\n"),
    # the request line: method SP request-target SP HTTP-version (RFC 9112 3)
    Vector("request-line-two-spaces-before-the-target", b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("request-line-two-spaces-before-the-version", b"GET /  HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector("request-line-two-spaces-pipelined", GET + b"GET  /hidden HTTP/1.1\r\nHost: x\r\n\r\n"),
    Vector(
        "request-line-two-spaces-after-chunked",
        chunked(b"5\r\nhello\r\n0\r\n\r\n") + b"GET /hidden  HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
    # version (RFC 9112 2.3)
    Vector("version-1.1x", b"GET / HTTP/1.1x\r\nHost: x\r\n\r\n"),
    Vector("version-1.2", b"GET / HTTP/1.2\r\nHost: x\r\n\r\n"),
    Vector("version-2.0", b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", note="llhttp parses 2.0; ours serves 1.0 and 1.1"),
    Vector("version-0.9", b"GET / HTTP/0.9\r\nHost: x\r\n\r\n", note="llhttp parses 0.9; ours serves 1.0 and 1.1"),
    Vector("version-lowercase", b"GET / http/1.1\r\nHost: x\r\n\r\n"),
    Vector("version-missing", b"GET /\r\nHost: x\r\n\r\n"),
    Vector("version-trailing-space", b"GET / HTTP/1.1 \r\nHost: x\r\n\r\n"),
    # head limits: 64 KiB, whether or not the head's end has arrived
    Vector(
        "head-of-70-kib",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (70 * 1024) + b"\r\n\r\n",
        note="a whole head in one read passes h11's limit (it bounds unfinished events only) and llhttp has none",
    ),
    Vector("head-of-70-kib-unfinished", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (70 * 1024)),
    Vector(
        "head-of-many-fields",
        b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Many: v\r\n" * 7000 + b"\r\n",
        note="a whole head in one read passes h11's limit (it bounds unfinished events only) and llhttp has none",
    ),
    # pipelining
    Vector("pipelined-three", GET * 3),
    Vector("pipelined-post-then-get", post(b"Content-Length: 5\r\n", b"hello") + GET),
    Vector("pipelined-chunked-then-get", chunked(b"5\r\nhello\r\n0\r\n\r\n") + GET),
    Vector("pipelined-then-malformed", GET + GET + post(b"Content-Length: +5\r\n", b"hello")),
    Vector(
        "pipelined-after-connection-close",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" + HIDDEN,
        note="llhttp reports bytes after Connection: close as an error; ours stops reading there (neither runs them)",
    ),
    Vector(
        "pipelined-after-http-1.0",
        b"GET / HTTP/1.0\r\n\r\n" + HIDDEN,
        note="llhttp reports bytes after a non-keep-alive request as an error; ours stops reading there",
    ),
    # smuggling: a front end and this server must not disagree on where a request ends
    Vector(
        "smuggle-bare-lf-hides-content-length",
        post(b"X-Pad: a\nContent-Length: %d\r\n" % (2 * len(HIDDEN)), HIDDEN * 2),
    ),
    Vector(
        "smuggle-bare-lf-swallows-transfer-encoding",
        b"POST / HTTP/1.1\nTransfer-Encoding: chunked\r\nHost: x\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(HIDDEN), HIDDEN),
    ),
    Vector("smuggle-cl-te", post(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + HIDDEN)),
    Vector("smuggle-te-cl", post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", b"0\r\n\r\n" + HIDDEN)),
    Vector(
        "smuggle-te-space-before-colon", post(b"Transfer-Encoding : chunked\r\nContent-Length: 4\r\n", b"0\r\n\r\n")
    ),
    Vector("smuggle-te-obs-fold", post(b"Transfer-Encoding: x\r\n chunked\r\n", b"0\r\n\r\n" + HIDDEN)),
    Vector("smuggle-chunk-size-lf", chunked(b"5\nhello\r\n0\r\n\r\n" + HIDDEN)),
]


@dataclass(frozen=True)
class Verdict:
    requests: tuple[tuple[str, bytes], ...]  # (method, body) of each request accepted, in order
    refused: bool

    def __str__(self) -> str:
        return f"{len(self.requests)} accepted{', then refused' if self.refused else ''}"


def h11_verdict(data: bytes) -> Verdict:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    conn.receive_data(data)
    accepted: list[tuple[str, bytes]] = []
    method, body = "", b""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return Verdict(tuple(accepted), True)
        if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            return Verdict(tuple(accepted), False)
        if isinstance(event, h11.Request):
            method, body = event.method.decode("latin-1"), b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            accepted.append((method, body))
            conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
            conn.send(h11.EndOfMessage())
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return Verdict(tuple(accepted), False)  # MUST_CLOSE: nothing more is read
            conn.start_next_cycle()


class _Recorder:
    def __init__(self, parser_of: list[httptools.HttpRequestParser]) -> None:
        self.parser_of = parser_of
        self.accepted: list[tuple[str, bytes]] = []
        self.body = b""

    def on_message_begin(self) -> None:
        self.body = b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.accepted.append((self.parser_of[0].get_method().decode("latin-1"), self.body))


def llhttp_verdict(data: bytes) -> Verdict:
    parser_of: list[httptools.HttpRequestParser] = []
    recorder = _Recorder(parser_of)
    parser_of.append(httptools.HttpRequestParser(recorder))
    try:
        parser_of[0].feed_data(data)
    except httptools.HttpParserUpgrade:
        pass
    except httptools.HttpParserError:
        return Verdict(tuple(recorder.accepted), True)
    return Verdict(tuple(recorder.accepted), False)


class _Answers:
    """Our server's answers, read by llhttp as a client would."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.answers: list[tuple[int, bytes]] = []
        self.body = b""

    def on_message_begin(self) -> None:
        self.body = b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:  # a 100 Continue probe of the half-closed connection is not an answer
            self.answers.append((status, self.body))


def verdict_of_answers(raw: bytes) -> Verdict:
    answers = _Answers()
    answers.parser.feed_data(raw)
    accepted: list[tuple[str, bytes]] = []
    for status, body in answers.answers:
        if status in REFUSALS:
            return Verdict(tuple(accepted), True)
        if status != 200:  # read as a request, but not one for a route (404, 405): not echoed
            accepted.append((f"<{status}>", b""))
            continue
        echo = json.loads(body)
        accepted.append((echo["method"], echo["body"].encode("latin-1")))
    return Verdict(tuple(accepted), False)


async def exchange(port: int, data: bytes, half_close: bool = True, timeout: float = 10.0) -> bytes:
    """Send ``data`` to a server on ``port``; with ``half_close`` shut down the sending side and read
    until the server closes, else read until it closes or stays silent for 1 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
            return await asyncio.wait_for(reader.read(), timeout)
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            while piece := await asyncio.wait_for(reader.read(65536), 1.0):
                received += piece
        return received
    finally:
        writer.close()
