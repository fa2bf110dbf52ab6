"""Streaming reader for Chrome-trace JSON as the PyTorch profiler (Kineto) writes it.

A profiler trace can be gigabytes of text, almost all of it CPU-side events (python frames,
aten ops, flow arrows) that trace comparison never looks at. `ChromeTraceReader` therefore never
holds the document: it reads the (optionally gzipped) text in chunks, walks the top-level object
until it reaches the `traceEvents` array, and hands out one parsed event at a time. Each event
is parsed with the C JSON scanner straight out of the chunk buffer, so the rate is close to
`json.loads` while memory stays at one chunk plus the largest single event.

Accepted layouts: `{"traceEvents": [...], ...}` (keys in any order, other keys kept in
`top_level` when small), a bare `[...]` list of events, gzip or plain. A file that is missing,
empty, not JSON, not a trace, or truncated raises one InferSimError naming the file.
"""

from __future__ import annotations

import gzip
import io
import sys
import json
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_CHUNK_CHARS = 1 << 20
# An event (or a top-level value other than traceEvents) larger than this is not a profiler
# event (they are under a few KB; deviceProperties and distributedInfo a few tens): stop instead of
# growing the buffer until memory runs out.
MAX_VALUE_CHARS = 16 << 20
# Top-level values other than traceEvents are kept only when this small (deviceProperties,
# distributedInfo, schemaVersion, ...); anything bigger is parsed and dropped.
MAX_KEPT_TOP_LEVEL_CHARS = 1 << 20

_CUT_MARGIN = 16  # characters: longer than any JSON literal or escape a chunk boundary can cut
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SCANNER = json.JSONDecoder().scan_once
#: the category a skip predicate sees for flow arrows
FLOW = "flow"
# how far to look for the end of a skipped event before parsing it the careful way
_SKIP_WINDOW = 1 << 14

SkipPredicate = Callable[[str, str], bool]


#: the trace path that means standard input
STDIN = "-"


class _Prefixed(io.RawIOBase):
    """`head` then the rest of `stream`: a stream read forward only (a pipe) with its first bytes
    put back after sniffing them."""

    def __init__(self, head: bytes, stream: io.BufferedIOBase) -> None:
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


class TraceFormatError(InferSimError):
    """The file is not a readable Chrome trace; the message names the file and what is wrong."""


class ChromeTraceReader:
    """Iterate the events of one Chrome-trace file without loading it.

    `top_level` fills with the document's other keys (e.g. `distributedInfo`) as they are passed;
    keys written after `traceEvents` are available once iteration has finished.
    """

    def __init__(self, path: str | Path, chunk_chars: int = DEFAULT_CHUNK_CHARS, skip: SkipPredicate | None = None
                 ) -> None:
        """skip(category, name) -> True: the event is not wanted and is passed over without being parsed,
        where its layout allows finding its end safely (Kineto's one-key-per-line layout; `name` is the
        raw JSON string body, escapes not decoded). Flow arrows are offered with category FLOW."""
        self.path = Path(path)
        self.chunk_chars = chunk_chars
        self.skip = skip
        self.events_skipped = 0
        self.top_level: dict[str, Any] = {}
        self.events_read = 0
        self.chars_read = 0

    # -- public ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._open() as stream:
            parser = _Parser(self, stream)
            yield from parser.document()

    # -- helpers -----------------------------------------------------------------------------

    def _open(self) -> io.TextIOBase:
        try:
            if str(self.path) == STDIN:
                raw: io.BufferedIOBase = open(sys.stdin.fileno(), "rb", closefd=False)
            else:
                raw = self.path.open("rb")
        except FileNotFoundError:
            raise TraceFormatError(f"{self.path}: file not found") from None
        except IsADirectoryError:
            raise TraceFormatError(f"{self.path}: is a directory, not a trace file") from None
        except OSError as exc:
            raise TraceFormatError(f"{self.path}: cannot read file: {exc.strerror}") from None
        # pipes and stdin cannot seek: read the magic bytes and put them back in front
        try:
            magic = raw.read(2)
        except OSError as exc:
            raise TraceFormatError(f"{self.path}: cannot read file: {exc.strerror or exc}") from None
        raw = io.BufferedReader(_Prefixed(magic, raw))
        binary: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if magic == GZIP_MAGIC else raw
        # strict UTF-8: a binary file that is neither gzip nor text fails on its first bytes
        return io.TextIOWrapper(binary, encoding="utf-8", errors="strict", newline="")

    def fail(self, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.path}: {problem}")


class _Parser:
    """Incremental walk over the document: a chunk buffer, a position in it and the C scanner."""

    def __init__(self, reader: ChromeTraceReader, stream: io.TextIOBase) -> None:
        self.reader = reader
        self.stream = stream
        self.buf = ""
        self.pos = 0
        self.base = 0  # characters discarded before buf[0]
        self.eof = False

    # -- buffer management -------------------------------------------------------------------

    def _read_more(self, chars: int = 0) -> bool:
        """Append the next `chars` characters (default: one chunk) to the buffer; False at the end."""
        if self.eof:
            return False
        try:
            chunk = self.stream.read(chars or self.reader.chunk_chars)
        except UnicodeDecodeError as exc:
            raise self.reader.fail(f"not a text trace: invalid UTF-8 near character {self.base + len(self.buf)} "
                                   f"({exc.reason})") from None
        except EOFError:
            raise self.reader.fail("truncated: the gzip stream ends early (an incomplete download or an "
                                   "interrupted profiler write)") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise self.reader.fail(f"corrupt gzip data ({exc})") from None
        except OSError as exc:
            raise self.reader.fail(f"cannot read file: {exc}") from None
        if not chunk:
            self.eof = True
            return False
        self.reader.chars_read += len(chunk)
        if self.pos:
            self.base += self.pos
            self.buf = self.buf[self.pos:] + chunk
            self.pos = 0
        else:
            self.buf += chunk
        return True

    def _skip_ws(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._read_more():
                return ""

    def _value(self, what: str) -> Any:
        """Parse one JSON value at pos, reading more text while it is incomplete. Each read doubles
        the text after pos, so a value of n characters is scanned O(n) times in all, not once per
        chunk (a gzip of a megabyte can hold a string of a billion characters)."""
        while True:
            try:
                value, end = _SCANNER(self.buf, self.pos)
            except StopIteration as stop:
                err_pos, msg = stop.value, "Expecting value"
            except json.JSONDecodeError as exc:
                err_pos, msg = exc.pos, exc.msg
            except RecursionError:
                raise self.reader.fail(f"{what} near character {self.base + self.pos} is nested too deeply") from None
            except ValueError:  # an integer beyond Python's 4,300-digit limit
                raise self.reader.fail(f"{what} near character {self.base + self.pos} holds a number too long to "
                                       "read (Python reads at most 4,300 digits)") from None
            else:
                if end < len(self.buf) or self.eof or not self._read_more(max(self.reader.chunk_chars,
                                                                               len(self.buf) - self.pos)):
                    self.pos = end
                    return value
                continue  # a bare number or literal may go on in the next chunk: parse it again
            # Near the end of the buffer the value may just be cut by the chunk boundary (a
            # partial `true` fails a few characters before the end); after EOF it is final.
            near_end = err_pos >= len(self.buf) - (1 if self.eof else _CUT_MARGIN)
            incomplete = near_end or msg.startswith("Unterminated")
            if not incomplete:
                raise self.reader.fail(f"malformed JSON in {what} at character {self.base + err_pos}: {msg}")
            if len(self.buf) - self.pos > MAX_VALUE_CHARS:
                raise self.reader.fail(f"{what} at character {self.base + self.pos} is larger than "
                                       f"{MAX_VALUE_CHARS // (1 << 20)} MiB; not a profiler event")
            pending = len(self.buf) - self.pos
            if not self._read_more(max(self.reader.chunk_chars, min(pending, MAX_VALUE_CHARS + 1 - pending))):
                raise self.reader.fail(f"truncated: the file ends inside {what} (character {self.base + err_pos}); "
                                       "the profiler did not finish writing it")

    def _expect_more(self, context: str) -> str:
        char = self._skip_ws()
        if not char:
            raise self.reader.fail(f"truncated: the file ends {context}; the profiler did not finish writing it")
        return char

    # -- grammar -----------------------------------------------------------------------------

    def document(self) -> Iterator[dict[str, Any]]:
        first = self._skip_ws()
        if first == "\ufeff":  # a byte-order mark some editors add
            self.pos += 1
            first = self._skip_ws()
        if not first:
            raise self.reader.fail("empty file, not a Chrome trace")
        if first == "[":
            yield from self._events()
        elif first == "{":
            yield from self._object()
        else:
            shown = self.buf[self.pos:self.pos + 20].split("\n")[0]
            raise self.reader.fail(f"not JSON: a Chrome trace starts with '{{' or '[', this file starts with {shown!r}")
        if self._skip_ws():
            raise self.reader.fail(f"malformed JSON: unexpected text after the end of the trace at character "
                                   f"{self.base + self.pos}")

    def _object(self) -> Iterator[dict[str, Any]]:
        self.pos += 1  # '{'
        found_events = False
        while True:
            char = self._expect_more("inside the top-level object")
            if char == "}":
                self.pos += 1
                break
            if char != '"':
                raise self.reader.fail(f"malformed JSON at character {self.base + self.pos}: expected a key")
            key = self._value("a top-level key")
            if self._expect_more(f"after the key {key!r}") != ":":
                raise self.reader.fail(f"malformed JSON at character {self.base + self.pos}: expected ':' after {key!r}")
            self.pos += 1
            char = self._expect_more(f"after the key {key!r}")
            if key == "traceEvents":
                if char != "[":
                    raise self.reader.fail("not a Chrome trace: 'traceEvents' is not a list")
                found_events = True
                yield from self._events()
            else:
                start = self.base + self.pos
                value = self._value(f"the top-level value {key!r}")
                if self.base + self.pos - start <= MAX_KEPT_TOP_LEVEL_CHARS:
                    self.reader.top_level[key] = value
            char = self._expect_more("inside the top-level object")
            if char == ",":
                self.pos += 1
            elif char != "}":
                raise self.reader.fail(f"malformed JSON at character {self.base + self.pos}: expected ',' or '}}'")
        if not found_events:
            keys = ", ".join(sorted(self.reader.top_level)) or "none"
            raise self.reader.fail(f"JSON but not a Chrome trace: no 'traceEvents' list (top-level keys: {keys})")

    def _skipped_end(self, buf: str, pos: int, skip: SkipPredicate, markers: dict[int, tuple[str, str]]) -> int:
        """End of the event at `pos` when the caller does not want it and its end can be found without
        parsing it; -1 otherwise (then it is parsed). Kineto writes an event's opening and closing
        braces alone on lines at the same indentation, every nested value deeper, and a JSON string
        holds no raw newline: the first newline + that indentation + '}' after the start closes it,
        provided no other event opens at that indentation before. The head ("ph", "cat", "name", in
        the profiler's spacing) is read with plain string searches: a regular expression costs as
        much as parsing the event. `markers`: per indentation, the (closing, opening) line starts."""
        cat = buf.find('"cat": "', pos, pos + 40)
        if cat < 0:
            ph = buf.find('"ph": "', pos, pos + 16)
            if ph < 0 or buf[ph + 7:ph + 9] not in ('s"', 'f"', 't"') or not skip(FLOW, ""):
                return -1
            close = buf.find("}", pos, pos + 4096)  # a flow arrow: flat, no nested values
            if close < 0 or buf.find("{", pos + 1, close) >= 0:
                return -1
            return close + 1
        if buf.find('"X"', pos, cat) < 0 or buf.find("\n", pos, cat) < 0:
            return -1  # not an "X" event, or one written on a single line (no closing line to find)
        cat += 8
        cat_end = buf.find('"', cat, cat + 64)
        name = buf.find('"name": "', cat_end, cat_end + 12)
        if cat_end < 0 or name < 0:
            return -1
        name += 9
        name_end = buf.find('"', name)
        if name_end < 0 or buf[name_end - 1] == "\\":
            return -1  # an escaped quote in the name: parse the event
        if not skip(buf[cat:cat_end], buf[name:name_end]):
            return -1
        indent = pos - buf.rfind("\n", pos - 80, pos) - 1
        pair = markers.get(indent)
        if pair is None:
            if indent > 40 or buf[pos - indent:pos].strip(" "):
                return -1
            pair = markers[indent] = ("\n" + " " * indent + "}", "\n" + " " * indent + "{")
        close = buf.find(pair[0], name_end, pos + _SKIP_WINDOW)
        if close < 0 or buf.find(pair[1], name_end, close) >= 0:
            return -1
        return close + indent + 2

    def _events(self) -> Iterator[dict[str, Any]]:
        self.pos += 1  # '['
        index = 0
        skip_ws = _WHITESPACE.match
        scan = _SCANNER
        reader = self.reader
        skip = reader.skip
        skipped_end = self._skipped_end
        markers: dict[int, tuple[str, str]] = {}
        while True:
            # Fast path: the event and the separator after it lie inside the buffer. Anything
            # else (chunk boundary, errors, odd separators) goes through the careful path.
            buf = self.buf
            pos = skip_ws(buf, self.pos).end()
            if pos < len(buf) and buf[pos] == "{":
                event = None
                end = skipped_end(buf, pos, skip, markers) if skip is not None else -1
                if end < 0:
                    event, end = _scan_whole(scan, buf, pos)
                if end > 0:
                    after = skip_ws(buf, end).end()
                    if after < len(buf) and buf[after] in ",]":
                        index += 1
                        if event:  # Kineto ends the list with an empty `{}`
                            yield event
                        elif event is None:
                            reader.events_skipped += 1
                        if buf[after] == "]":
                            self.pos = after + 1
                            reader.events_read = index
                            return
                        self.pos = after + 1
                        continue
            self.pos = pos
            char = self._expect_more("inside the traceEvents list")
            if char == "]":
                self.pos += 1
                reader.events_read = index
                return
            if char == ",":  # tolerate the empty element some writers leave (`[{...},,{...}]`, `,]`)
                self.pos += 1
                continue
            event = self._value(f"traceEvents[{index}]")
            if not isinstance(event, dict):
                raise reader.fail(f"not a Chrome trace: traceEvents[{index}] is a {type(event).__name__}, "
                                  "not an event object")
            index += 1
            reader.events_read = index
            if event:
                yield event
            char = self._expect_more("inside the traceEvents list")
            if char == ",":
                self.pos += 1
            elif char != "]":
                raise reader.fail(f"malformed JSON at character {self.base + self.pos}: expected ',' or ']' "
                                  f"after traceEvents[{index - 1}]")


def _scan_whole(scan: Callable[[str, int], tuple[Any, int]], buf: str, pos: int) -> tuple[Any, int]:
    """The JSON value at `pos` and the index after it, or (None, -1) when it does not end inside
    `buf` or is malformed (the careful path then reads it and names any error)."""
    try:
        return scan(buf, pos)
    except (StopIteration, ValueError, RecursionError):  # ValueError includes JSONDecodeError
        return None, -1


def iter_trace_events(path: str | Path, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Iterator[dict[str, Any]]:
    """The events of a Chrome-trace file, one parsed dict at a time."""
    return iter(ChromeTraceReader(path, chunk_chars))
