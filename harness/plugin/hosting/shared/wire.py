"""The plugin host's wire format: data, never code, between the harness and a plugin host.

A message is a JSON header plus the raw bytes of the arrays it carries, framed as
``<MAGIC><header length><payload length><header><payload>`` (:data:`MAGIC`, then two
unsigned 64-bit little-endian lengths): bytes that do not begin a frame (a plugin writing
to the descriptor the answers travel on) are a broken stream at once, never a wait for
bytes that will not come. Values are JSON (``None``, booleans, numbers, strings, lists,
dicts with string keys) or tagged dicts ``{"__wire__": tag, ...}`` for

- ``ndarray`` and ``tensor``: a numpy array or a torch tensor (sent from the CPU), its
  dtype from :data:`DTYPES`, its shape and the index of its bytes in the payload;
- ``bytes``: raw bytes (a certifier's state records).

Nothing is unpickled and nothing is evaluated: a plugin host is third-party code, and
what it answers can only be numbers, strings and arrays of the listed dtypes, which the
harness then audits as claims (harness/README.md, "Plugin host").

Nor is anything allocated on a plugin host's word: the harness reads each answer against a
:class:`Limit` derived from its request
(:func:`harness.plugin.hosting.in_harness.limits.answer_limit`), and a frame whose head
claims a longer header or payload is :class:`PastLimit` before a byte of it is held. The
header's decoded value is bounded by its bytes (each item takes at least two of them: at
most some 50 bytes of Python objects per header byte, and no copy is made of it), its
nesting by :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

TAG = "__wire__"
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "bfloat16")  # fmt: skip
"""Every dtype an array may have on the wire (``bfloat16``: torch tensors only)."""
MAGIC = b"IDRW"
HEAD = struct.Struct("<4sQQ")
"""A frame's head: :data:`MAGIC`, the header's length and the payload's."""
MAX_HEADER = 1 << 28
"""Largest header of a message read without a :class:`Limit` (the harness's requests, as the
host reads them): a longer one is a broken stream, not a message."""
MAX_DEPTH = 64
"""Deepest nesting of lists and dicts a message's value may have."""


class WireError(ValueError):
    """A message that does not follow this format (a broken stream or a value that
    cannot be sent)."""


class PastLimit(WireError):
    """A frame whose head claims more bytes than its reader's :class:`Limit` (refused
    before anything is allocated for it)."""


@dataclass(frozen=True)
class Limit:
    """The largest frame a reader accepts: its JSON ``header`` and its ``payload``, in
    bytes; ``what`` says what they were derived from (errors name it)."""

    header: int
    payload: int
    what: str = ""


class _Payload:
    """The payload being assembled: its byte strings and their total length."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> dict[str, int]:
        """Append ``data``; where it lies (``blob``: its offset, ``nbytes``)."""
        self.parts.append(data)
        self.size += len(data)
        return {"blob": self.size - len(data), "nbytes": len(data)}


def encode(value: Any) -> bytes:
    """One framed message holding ``value``."""
    payload = _Payload()
    header = json.dumps(_pack(value, payload), separators=(",", ":")).encode()
    return HEAD.pack(MAGIC, len(header), payload.size) + header + b"".join(payload.parts)


def write_message(stream: BinaryIO, value: Any) -> None:
    stream.write(encode(value))
    stream.flush()


def read_message(stream: BinaryIO) -> Any:
    """The next message's value; raises :class:`EOFError` when the stream has ended."""
    header_length, payload_length = lengths(_read_exactly(stream, HEAD.size, at_start=True))
    header = _read_exactly(stream, header_length)
    return decode(header, memoryview(bytearray(_read_exactly(stream, payload_length))))


def lengths(head: bytes, limit: Limit | None = None) -> tuple[int, int]:
    """The header's and the payload's lengths a frame's head gives (:data:`HEAD`); a
    :class:`WireError` when the bytes are not a frame's head, a :class:`PastLimit` when
    they claim more than ``limit`` (None: a header up to :data:`MAX_HEADER`)."""
    magic, header_length, payload_length = HEAD.unpack(head)
    if magic != MAGIC:
        raise WireError(f"bytes that begin no message ({bytes(head[:16])!r}): something other "
                        "than the plugin host wrote to the channel of its answers")  # fmt: skip
    if limit is None:
        if header_length > MAX_HEADER:
            raise WireError(f"a message header of {header_length} bytes: the stream is broken")
        return header_length, payload_length
    for part, length, most in (("header", header_length, limit.header),
                               ("payload", payload_length, limit.payload)):  # fmt: skip
        if length > most:
            raise PastLimit(f"a frame whose head claims a {part} of {length} bytes, past the "
                            f"limit of {most} bytes ({limit.what or 'this request'})")  # fmt: skip
    return header_length, payload_length


def decode(header: bytes | memoryview, payload: memoryview) -> Any:
    """The value of a frame's ``header`` (JSON) and ``payload`` (its arrays' bytes)."""
    try:
        value = json.loads(bytes(header))
    except RecursionError:
        raise WireError(f"a message header nested deeper than {MAX_DEPTH}") from None
    except (UnicodeDecodeError, ValueError) as exc:  # (JSONDecodeError; an int of 4,300 digits)
        raise WireError(f"a message header that is not JSON ({exc}): a broken stream") from None
    return _unpack(value, payload, 0)


def _read_exactly(stream: BinaryIO, count: int, at_start: bool = False) -> bytes:
    chunks, left = [], count
    while left:
        chunk = stream.read(left)
        if not chunk:
            if at_start and left == count:
                raise EOFError("the stream ended")
            raise WireError(f"the stream ended {left} bytes before the end of a message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _pack(value: Any, blobs: _Payload) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_pack(v, blobs) for v in value]
    if isinstance(value, dict):
        if TAG in value or not all(isinstance(k, str) for k in value):
            raise WireError(f"a dict sent on the wire needs string keys other than {TAG!r}")
        return {k: _pack(v, blobs) for k, v in value.items()}
    if isinstance(value, bytes | bytearray | memoryview):
        return {TAG: "bytes", **blobs.add(bytes(value))}
    if isinstance(value, np.ndarray):
        return _pack_array(value, "ndarray", blobs)
    try:
        import torch
    except ImportError:  # pragma: no cover (the harness always has torch)
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        if tensor.dtype == torch.bfloat16:
            return {**_pack_array(tensor.view(torch.int16).numpy(), "tensor", blobs),
                    "dtype": "bfloat16"}  # fmt: skip
        return _pack_array(tensor.numpy(), "tensor", blobs)
    raise WireError(f"a {type(value).__name__} cannot be sent to or from a plugin host")


def _pack_array(array: np.ndarray, tag: str, blobs: _Payload) -> dict[str, Any]:
    dtype = array.dtype.name
    if dtype not in DTYPES or array.dtype.byteorder == ">":
        raise WireError(f"an array of dtype {array.dtype} cannot be sent (dtypes: {DTYPES})")
    where = blobs.add(np.ascontiguousarray(array).tobytes())
    return {TAG: tag, "dtype": dtype, "shape": list(array.shape), **where}


def _unpack(value: Any, payload: memoryview, depth: int) -> Any:
    """``value`` with its tagged dicts replaced by what they stand for, in place (no copy
    of a large header is made)."""
    if isinstance(value, list | dict) and depth >= MAX_DEPTH:
        raise WireError(f"a message header nested deeper than {MAX_DEPTH}")
    if isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, list | dict):
                value[i] = _unpack(v, payload, depth + 1)
        return value
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        for k, v in value.items():
            if isinstance(v, list | dict):
                value[k] = _unpack(v, payload, depth + 1)
        return value
    start, nbytes = value.get("blob"), value.get("nbytes")
    if not (isinstance(start, int) and isinstance(nbytes, int) and start >= 0
            and nbytes >= 0 and start + nbytes <= len(payload)):  # fmt: skip
        raise WireError(f"a {tag} outside the message's payload")
    data = payload[start : start + nbytes]
    if tag == "bytes":
        return bytes(data)
    if tag not in ("ndarray", "tensor"):
        raise WireError(f"unknown wire tag {tag!r}")
    dtype, shape = value.get("dtype"), value.get("shape")
    if dtype not in DTYPES or not (
        isinstance(shape, list) and len(shape) <= 32  # (the most dimensions numpy 1 allows)
        and all(type(s) is int and s >= 0 for s in shape)
    ):  # fmt: skip
        raise WireError(f"an array of dtype {dtype!r} and shape {shape!r:.200} cannot be received")
    stored = "int16" if dtype == "bfloat16" else dtype
    count = math.prod(shape)  # (exact: no shape wraps around to the payload's length)
    if count * np.dtype(stored).itemsize != nbytes:
        raise WireError(f"an array of shape {shape} and dtype {dtype} in {nbytes} bytes")
    array = np.frombuffer(data, dtype=stored, count=count).reshape(shape)
    if tag == "ndarray":
        return array
    import torch

    try:
        tensor = torch.from_numpy(array)
    except TypeError as exc:  # a dtype torch has no tensors of (uint32 in older releases)
        raise WireError(f"a tensor of dtype {dtype} cannot be received ({exc})") from None
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
