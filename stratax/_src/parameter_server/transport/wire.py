"""The parameter-server wire format: a small JSON header plus raw tensor bytes, never pickle.

A frame is::

    b"SXPS" | version: uint16 LE | header length: uint32 LE | header (UTF-8 JSON) | payload

The header is ``{"meta": {...}, "tensors": [{"dtype": "float32", "shape": [2, 3]}, ...]}``:
``meta`` carries small metadata (method arguments, step ids, error text) and ``tensors``
describes the payload, which is the tensors' raw little-endian bytes back to back, in order.

``decode`` validates every field before anything is built: magic, version, header length,
JSON shape, dtype against an allow-list, shape entries (non-negative ints, bounded rank),
element counts against the payload length, and overall size limits. A malformed frame raises
``WireError`` and nothing else happens, so a server can reject it with no state change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MAGIC = b"SXPS"
VERSION = 1
_PREFIX = struct.Struct("<4sHI")
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 4096
MAX_RANK = 8
# A frame may not exceed this many bytes (a 4M x 64 float32 table is 1 GiB; shards are smaller).
MAX_FRAME_BYTES = 2 << 30
ALLOWED_DTYPES = frozenset(
    ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
     "uint8", "uint16", "uint32", "uint64", "bool"]
)


# Native-order dtypes of the allow-list by value, to name a tensor's dtype without numpy's slow
# ``dtype.name`` (a frame may carry hundreds of tensors).
_DTYPE_NAMES = {np.dtype(n): n for n in ALLOWED_DTYPES if n != "bfloat16"}


class WireError(ValueError):
    """A frame that does not follow the wire format; the message says which field is wrong."""


@dataclasses.dataclass
class Frame:
    """A decoded frame: small JSON metadata and a list of numpy arrays."""

    meta: dict[str, Any]
    tensors: list[np.ndarray]


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # installed with JAX

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def encode(meta: Mapping[str, Any] | None = None, tensors: Sequence[Any] = ()) -> bytes:
    """Builds a frame from JSON-serialisable ``meta`` and numpy-convertible ``tensors``.

    Raises:
      WireError: a tensor's dtype is not on the allow-list, or the frame is too large.
    """
    return b"".join(encode_parts(meta, tensors))


def encode_parts(meta: Mapping[str, Any] | None = None,
                 tensors: Sequence[Any] = ()) -> list[bytes | memoryview]:
    """``encode``'s frame as a list of buffers (prefix and header, then a view of each
    tensor's bytes), so a large frame can be sent in chunks without being copied whole."""
    arrays = []
    specs = []
    for index, tensor in enumerate(tensors):
        array = tensor if type(tensor) is np.ndarray else np.asarray(tensor)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        name = _DTYPE_NAMES.get(array.dtype)
        if name is None:
            name = array.dtype.name
            if name not in ALLOWED_DTYPES:
                raise WireError(
                    f"Tensor {index} has dtype {name!r}, which the wire does not carry; "
                    f"cast it to one of {sorted(ALLOWED_DTYPES)}."
                )
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
        arrays.append(array)
        specs.append({"dtype": name, "shape": list(array.shape)})
    header = json.dumps({"meta": dict(meta or {}), "tensors": specs}, separators=(",", ":"))
    header_bytes = header.encode("utf-8")
    # Trailing spaces (valid JSON) put the payload at a multiple of 64 bytes from the frame's
    # start, so decoded tensors are aligned views in an aligned buffer.
    header_bytes += b" " * (-(_PREFIX.size + len(header_bytes)) % 64)
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise WireError(f"Frame header of {len(header_bytes)} bytes exceeds {MAX_HEADER_BYTES}.")
    parts: list[bytes | memoryview] = [
        _PREFIX.pack(MAGIC, VERSION, len(header_bytes)) + header_bytes]
    parts.extend(memoryview(a.reshape(-1).view(np.uint8)) for a in arrays if a.size)
    total = sum(len(p) for p in parts)
    if total > MAX_FRAME_BYTES:
        raise WireError(f"Frame of {total} bytes exceeds the limit of {MAX_FRAME_BYTES}.")
    return parts


def decode(data: bytes | bytearray | memoryview) -> Frame:
    """Parses and validates a frame; the arrays are views of ``data`` (no copy), writable only
    when ``data`` is (a ``bytearray``).

    Raises:
      WireError: any field is missing, of the wrong type, out of bounds or inconsistent.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"A frame must be bytes, got {type(data).__name__}.")
    view = memoryview(data).cast("B")
    total = len(view)
    if total > MAX_FRAME_BYTES:
        raise WireError(f"Frame of {total} bytes exceeds the limit of {MAX_FRAME_BYTES}.")
    if total < _PREFIX.size:
        raise WireError(f"Frame of {total} bytes is shorter than the {_PREFIX.size}-byte prefix.")
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError(f"Frame starts with {bytes(magic)!r}, expected {MAGIC!r}.")
    if version != VERSION:
        raise WireError(f"Frame version {version} is not supported (this side speaks {VERSION}).")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > total:
        raise WireError(
            f"Frame header length {header_len} does not fit the {total}-byte frame "
            f"(limit {MAX_HEADER_BYTES})."
        )
    try:
        header = json.loads(bytes(view[_PREFIX.size:_PREFIX.size + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise WireError(f"Frame header is not UTF-8 JSON: {err}") from None
    if not isinstance(header, dict) or set(header) != {"meta", "tensors"}:
        raise WireError("Frame header must be a JSON object with exactly 'meta' and 'tensors'.")
    meta, specs = header["meta"], header["tensors"]
    if not isinstance(meta, dict):
        raise WireError(f"Frame 'meta' must be a JSON object, got {type(meta).__name__}.")
    if not isinstance(specs, list) or len(specs) > MAX_TENSORS:
        raise WireError(f"Frame 'tensors' must be a list of at most {MAX_TENSORS} entries.")
    offset = _PREFIX.size + header_len
    tensors = []
    for index, spec in enumerate(specs):
        dtype, shape, nbytes = _check_spec(index, spec)
        if offset + nbytes > total:
            raise WireError(
                f"Tensor {index} needs {nbytes} bytes but only {total - offset} remain in "
                "the frame."
            )
        try:
            array = np.frombuffer(view[offset:offset + nbytes], dtype=dtype).reshape(shape)
        except ValueError as err:  # what the checks above missed is still the wire's error
            raise WireError(f"Tensor {index} of shape {list(shape)}: {err}") from None
        tensors.append(array)
        offset += nbytes
    if offset != total:
        raise WireError(f"Frame has {total - offset} trailing bytes after its tensors.")
    return Frame(meta, tensors)


def _check_spec(index: int, spec: object) -> tuple[np.dtype, tuple[int, ...], int]:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape"}:
        raise WireError(f"Tensor {index} spec must be an object with 'dtype' and 'shape'.")
    name, shape = spec["dtype"], spec["shape"]
    if not isinstance(name, str) or name not in ALLOWED_DTYPES:
        raise WireError(f"Tensor {index} has dtype {name!r}, not one of {sorted(ALLOWED_DTYPES)}.")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise WireError(
            f"Tensor {index} shape {shape!r} must be a list of at most {MAX_RANK} ints.")
    for dim in shape:
        if type(dim) is not int or dim < 0 or dim > MAX_FRAME_BYTES:
            raise WireError(f"Tensor {index} shape {shape!r} has an invalid dimension {dim!r}.")
    dtype = _numpy_dtype(name)
    # The product of the non-zero dimensions too: numpy refuses to shape even an empty array
    # as [0, 2**31, 2**31, 2**31] (its size would overflow), with a plain ValueError.
    if math.prod(d or 1 for d in shape) * dtype.itemsize > MAX_FRAME_BYTES:
        raise WireError(f"Tensor {index} of shape {shape} is larger than the frame limit "
                        f"of {MAX_FRAME_BYTES} bytes.")
    return dtype, tuple(shape), math.prod(shape) * dtype.itemsize


def require(meta: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``meta[key]`` checked to be of ``kind`` (bools are not ints); else ``WireError``."""
    if key not in meta:
        raise WireError(f"Frame metadata lacks the field {key!r}.")
    value = meta[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise WireError(f"Frame field {key!r} is {value!r}, expected {kinds}.")
    if not isinstance(value, kinds):
        raise WireError(f"Frame field {key!r} is {value!r}, expected {kinds}.")
    return value
