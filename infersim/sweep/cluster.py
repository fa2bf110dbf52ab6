"""A Dask scheduler as a sweep's executor (`--executor dask://HOST:PORT`), checked before it is used.

Dask's client trusts its peer: pointed at a server that accepts and says nothing it waits for ever,
and pointed at an HTTP server it reads the reply's first eight bytes ("HTTP/1.1") as a message
length and asks for exabytes. So before a client is made, the address is parsed (only dask:// and
tcp:// with a host and a port), a plain socket connects with a timeout, and the first message is
read as Dask's TCP framing lays it out (distributed.comm.tcp: an 8-byte length, then a frame count
and the frames' lengths): a Dask server sends its handshake (compression, Python version, pickle
protocol) as soon as it accepts, before it reads anything. Whatever is not that is one message.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import socket
import struct
from typing import Any

from infersim.base.errors import InferSimError, echo

#: seconds to connect, and then to receive the scheduler's handshake
CONNECT_TIMEOUT_S = 10.0
#: a Dask handshake is a few dozen bytes (a small msgpack mapping); a length above this is not Dask
MAX_HANDSHAKE_BYTES = 1 << 16
SCHEMES = ("dask://", "tcp://")

_ADDRESS = re.compile(r"(?P<scheme>[a-z]+)://(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")
_LENGTH = struct.Struct("<Q")


class NotAScheduler(InferSimError):
    """The address answers, but not as a Dask scheduler (or not at all)."""


def parse_address(address: str, option: str = "--executor") -> tuple[str, int]:
    """(host, port) of dask://HOST:PORT or tcp://HOST:PORT; anything else is one message."""
    match = _ADDRESS.fullmatch(address.strip())
    if match is None or f"{match['scheme']}://" not in SCHEMES:
        raise InferSimError(f"{option} {echo(address)}: expected dask://HOST:PORT (or tcp://HOST:PORT), the address "
                            "of a Dask scheduler")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise InferSimError(f"{option} {echo(address)}: port {port} is not between 1 and 65535")
    return match["host"].strip("[]"), port


def _receive(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _handshake_frames(body: bytes) -> list[bytes] | None:
    """The frames of a Dask message body (a frame count, the frames' lengths, the frames), or None
    when the body is not laid out so."""
    if len(body) < _LENGTH.size:
        return None
    (count,) = _LENGTH.unpack_from(body)
    header = _LENGTH.size * (1 + count)
    if not 1 <= count <= 16 or header > len(body):
        return None
    lengths = [_LENGTH.unpack_from(body, _LENGTH.size * (1 + i))[0] for i in range(count)]
    if header + sum(lengths) != len(body):
        return None
    frames, start = [], header
    for length in lengths:
        frames.append(body[start:start + length])
        start += length
    return frames


def _is_handshake(frames: list[bytes]) -> bool:
    """Whether the frames decode (Dask's own decoder) to a handshake: a mapping naming its pickle protocol."""
    from distributed.protocol import loads

    try:
        message = loads(frames)
    except Exception:  # noqa: BLE001 - any failure to decode means the peer does not speak Dask
        return False
    return isinstance(message, dict) and "pickle-protocol" in message


def probe_scheduler(address: str, timeout_s: float | None = None, option: str = "--executor") -> None:
    """Connect to `address` and read its first message within `timeout_s` each; one message unless
    it is a Dask handshake."""
    timeout = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    host, port = parse_address(address, option)
    where = f"{option} {address}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise NotAScheduler(f"{where}: no connection within {timeout:g} s") from None
    except OSError as exc:
        raise NotAScheduler(f"{where}: cannot connect ({exc.strerror or exc})") from None
    with sock:
        sock.settimeout(timeout)
        try:
            head = _receive(sock, _LENGTH.size)
            (size,) = _LENGTH.unpack(head)
            if not _LENGTH.size <= size <= MAX_HANDSHAKE_BYTES:
                raise NotAScheduler(f"{where}: the server's first bytes {head!r} are not a Dask message: not a Dask "
                                    "scheduler (a web server, or another service, on that port?)")
            frames = _handshake_frames(_receive(sock, size))
        except TimeoutError:
            raise NotAScheduler(f"{where}: connected, but no Dask handshake within {timeout:g} s: not a Dask "
                                "scheduler (a server that waits for the client to speak first?)") from None
        except OSError as exc:
            raise NotAScheduler(f"{where}: the connection failed before a Dask handshake ({exc.strerror or exc}): "
                                "not a Dask scheduler") from None
    if frames is None or not _is_handshake(frames):
        raise NotAScheduler(f"{where}: the server's first message is not a Dask handshake: not a Dask scheduler")


def dask_executor(address: str, option: str = "--executor") -> tuple[cf.Executor, Any]:
    """An Executor sending chunks to the Dask scheduler at `address` (dask://HOST:PORT or
    tcp://HOST:PORT), after `probe_scheduler`; returns (executor, client): close the client when done."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise InferSimError(f"{option} dask://...: Dask is not installed; pip install 'dask[distributed]' "
                            "(or, in the infersim clone: pip install '.[dask]')") from None
    host, port = parse_address(address, option)
    probe_scheduler(address, option=option)
    target = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    try:
        client = Client(target, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a Dask server that is not a scheduler fails in many ways
        raise NotAScheduler(f"{option} {address}: a Dask server, but the client could not register with it "
                            f"({type(exc).__name__}: {exc}): give the address of a Dask scheduler, not a worker's"
                            ) from None
    return client.get_executor(), client
