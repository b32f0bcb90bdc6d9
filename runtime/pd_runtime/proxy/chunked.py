"""HTTP/1.1 chunked transfer coding, decoded incrementally: the engines' streamed answers and chunked
client request bodies both arrive in reads that may split a chunk anywhere."""

from __future__ import annotations

from typing import Literal


class ChunkedDecoder:
    """Feed it reads, get the body bytes they completed; ``done`` once the last chunk and trailer are in.

    vLLM writes one SSE event per chunk and a read usually holds whole chunks, so a chunk found whole is
    taken in one step (the profile's hottest lines were here). Raises ValueError on malformed framing.
    """

    def __init__(self) -> None:
        self.done = False
        self.rest = b""  # bytes after the body's end (the next request on a keep-alive connection)
        self._partial = b""  # an unfinished size line or chunk trailer
        self._left = 0  # bytes left of the current chunk
        self._step: Literal["size", "data", "crlf", "trailer"] = "size"

    def feed(self, data: bytes) -> bytes:
        if self._partial:
            data, self._partial = self._partial + data, b""
        pos, size, out = 0, len(data), []
        step, left = self._step, self._left
        while pos < size and not self.done:
            if step == "size":
                end = data.find(b"\r\n", pos)
                if end < 0:
                    self._partial = data[pos:]
                    break
                line = data[pos:end]
                left = int(line.split(b";", 1)[0] if b";" in line else line, 16)
                pos = end + 2
                if not left:
                    step = "trailer"
                elif pos + left + 2 <= size:  # the whole chunk and its CRLF are here
                    if data[pos + left : pos + left + 2] != b"\r\n":
                        raise ValueError("chunk not followed by CRLF")
                    out.append(data[pos : pos + left])
                    pos += left + 2
                else:
                    step = "data"
            elif step == "data":
                end = min(size, pos + left)
                out.append(data[pos:end])
                left -= end - pos
                pos = end
                if not left:
                    step = "crlf"
            elif step == "crlf":
                if size - pos < 2:
                    self._partial = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                pos += 2
                step = "size"
            else:  # trailer: lines up to the empty one after the last chunk
                end = data.find(b"\r\n", pos)
                if end < 0:
                    self._partial = data[pos:]
                    break
                if end == pos:
                    self.done = True
                    pos += 2
                    break
                pos = end + 2
        self._step, self._left = step, left
        self.rest = data[pos:] if self.done else b""
        return out[0] if len(out) == 1 else b"".join(out)
