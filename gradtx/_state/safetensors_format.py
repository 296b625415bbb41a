"""Reading and writing the safetensors file format, with NumPy only and nothing unpickled.

A file holds, in order: the header's length in bytes (8 bytes, unsigned little-endian), the
header (UTF-8 JSON, padded with spaces so the data starts at a multiple of 8 bytes), then the
tensors' raw little-endian bytes, one after another with no gaps. The header maps each tensor's
name to `{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}` (offsets into the data
part) and holds string-to-string metadata under `"__metadata__"`. This is the format of the
`safetensors` package (https://github.com/huggingface/safetensors), so its readers open these
files, and every dtype is recorded by name, bfloat16 ("BF16") included.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import zlib
from typing import Any

import jax.numpy as jnp
import numpy as np

# The format's dtype names. jax.numpy's bfloat16 and float8 types are ml_dtypes' NumPy types.
DTYPES: dict[str, Any] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(jnp.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(jnp.float8_e4m3fn),
    "F8_E5M2": np.dtype(jnp.float8_e5m2),
    "C64": np.dtype(np.complex64),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The reference reader refuses larger headers; so does this one, before reading them.
_MAX_HEADER = 100_000_000
_LITTLE = sys.byteorder == "little"


def dtype_name(dtype: Any, name: str) -> str:
    """The format's name for `dtype`; `name` (the tensor's) goes into the error."""
    try:
        return _NAMES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(
            f"the array at {name!r} has dtype {dtype}, which the safetensors format cannot "
            f"hold (it holds {', '.join(str(d) for d in DTYPES.values())}); cast it first."
        ) from None


def checksum(array: np.ndarray) -> str:
    """The CRC-32 of `array`'s bytes as a file stores them (little-endian), as 8 hex digits.

    CRC-32 (`zlib.crc32`) catches every burst of flipped bits up to 32 long, at the speed of
    reading the bytes. It guards against damage, not against someone who edits the file.
    """
    array = np.ascontiguousarray(array)
    if not _LITTLE:
        array = array.byteswap()
    return f"{zlib.crc32(array.reshape(-1).view(np.uint8).data):08x}"


def write(
    path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]
) -> None:
    """Write `tensors` and `metadata` to `path` atomically (a temp file, then `os.replace`).

    A reader sees either the old file or the whole new one, never a partial write.
    """
    # Larger items first: with the data starting 8-byte aligned, every tensor is then aligned
    # to its own item size, so readers may map it in place.
    order = sorted(tensors, key=lambda n: -tensors[n].dtype.itemsize)
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        array = tensors[name]
        header[name] = {
            "dtype": dtype_name(array.dtype, name),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {os.fspath(path)!r}: no directory {directory!r}.")
    temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}")
    # O_EXCL: never write into a file someone else made; 0o666 lets the umask decide the mode.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in order:
                array = np.ascontiguousarray(tensors[name])
                f.write((array if _LITTLE else array.byteswap()).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    # The rename is durable only once the directory entry is on disk too (POSIX only).
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """`(tensors, metadata)` read from the safetensors file at `path`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is not in the safetensors format (the message says what is wrong).
    """
    shown = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint file at {shown!r}.")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, start = _read_header(f, shown, size)
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ValueError(f"{shown!r}: the header's __metadata__ is not a map of strings.")
        tensors = {}
        for name, entry in header.items():
            dtype, shape, (begin, end) = _entry(shown, name, entry)
            if begin < 0 or start + end > size or end - begin != dtype.itemsize * math.prod(shape):
                raise ValueError(
                    f"{shown!r}: the offsets {[begin, end]} of tensor {name!r} do not fit its "
                    f"shape {list(shape)} and dtype, or the file ({size} bytes) is truncated."
                )
            array = np.empty(shape, dtype)
            f.seek(start + begin)
            if array.nbytes and f.readinto(array.reshape(-1).view(np.uint8).data) != array.nbytes:
                raise ValueError(f"{shown!r}: the data of tensor {name!r} is truncated.")
            tensors[name] = array if _LITTLE else array.byteswap()
    return tensors, metadata


def _read_header(f: Any, shown: str, size: int) -> tuple[dict[str, Any], int]:
    """The header, and where the data starts."""
    raw = f.read(8)
    not_safetensors = f"{shown!r} is not a safetensors file"
    if len(raw) < 8:
        raise ValueError(f"{not_safetensors}: it is {size} bytes long.")
    (length,) = struct.unpack("<Q", raw)
    if length > min(_MAX_HEADER, size - 8):
        raise ValueError(f"{not_safetensors}: its first 8 bytes give no valid header length.")
    text = f.read(length)
    try:
        header = json.loads(text.decode(), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{not_safetensors}: its header is not JSON ({e}).") from None
    if not isinstance(header, dict):
        raise ValueError(f"{not_safetensors}: its header is not a JSON object.")
    return header, 8 + length


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = [k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])]
        raise ValueError(f"the header names {seen[0]!r} twice")
    return out


def _entry(shown: str, name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], list[int]]:
    try:
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(int(n) for n in entry["shape"])
        begin, end = (int(n) for n in entry["data_offsets"])
        if any(n < 0 for n in shape):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{shown!r}: the header entry of tensor {name!r} is not a safetensors entry with "
            f"a known dtype ({', '.join(DTYPES)}): {entry!r}."
        ) from None
    return dtype, shape, [begin, end]
