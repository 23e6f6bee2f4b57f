"""The header and tensor table of a GGUF file, read without the ``gguf`` package's reader.

``gguf.GGUFReader`` builds a numpy view of every part of every metadata field; on SmolLM2's file that is
about 250 000 views for the tokenizer's vocabulary and merges alone, 4-5 s before the first tensor is read.
The lean forward needs a dozen scalar fields and the tensor table, so this reader skips array fields by
their lengths and memory-maps the tensor data (nothing is copied until a tensor is used).

Format (GGUF v2 and v3, little-endian): magic ``GGUF``, ``uint32`` version, ``uint64`` tensor count,
``uint64`` field count; each field a string key, a ``uint32`` value type and the value (arrays: element type,
``uint64`` count, elements; strings: ``uint64`` length and UTF-8 bytes); each tensor a name, ``uint32``
dimension count, ``uint64`` dimensions (innermost first), ``uint32`` type and ``uint64`` offset into the data
section, which starts at the next multiple of ``general.alignment`` (default 32) after the table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GGUFFile", "GGUFTensor", "read_gguf_file"]

#: scalar value types: struct format
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: plain element types, viewed as numpy arrays of their element (every other type stays raw bytes, as in
#: ``gguf.GGUFReader``, for ``gguf.dequantize``)
_ELEMENTS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
             "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: ``data`` is a read-only view of its bytes in the file, ``[rows, bytes per row]`` (uint8)
    for block types and ``[rows, columns]`` of the element type otherwise (numpy order: ``shape`` reversed)."""

    name: str
    type_id: int
    type_name: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """Scalar and string fields (array fields are skipped: ``None`` under their key) and the tensors."""

    version: int
    fields: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer, self.pos = buffer, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        text = bytes(self.buffer[self.pos:self.pos + length]).decode("utf-8", errors="replace")
        self.pos += length
        return text

    def skip_value(self, value_type: int) -> None:
        if value_type in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[value_type])
        elif value_type == _STRING:
            length = self.unpack("<Q")  # read before adding: unpack moves pos
            self.pos += length
        elif value_type == _ARRAY:
            self.skip_array()
        else:
            raise ValueError(f"unknown GGUF value type {value_type} at byte {self.pos}")

    def skip_array(self) -> None:
        element_type, count = self.unpack("<I"), self.unpack("<Q")
        if element_type in _SCALARS:
            self.pos = self.pos + count * struct.calcsize(_SCALARS[element_type])
        else:
            for _ in range(count):
                self.skip_value(element_type)


def read_gguf_file(path: str) -> GGUFFile:
    """The fields and tensor table of the GGUF file at ``path`` (``ValueError`` if it is not GGUF v2/v3, is
    truncated, or holds a tensor type the ``gguf`` package does not know)."""
    try:
        return _read(path)
    except (struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"truncated or corrupt GGUF file ({error}): path={path!r}") from None


def _read(path: str) -> GGUFFile:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(mapped.data)
    if bytes(mapped[:4]) != b"GGUF":
        raise ValueError(f"not a GGUF file (bad magic): path={path!r}")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3): path={path!r}")
    tensor_count, field_count = cursor.unpack("<Q"), cursor.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(field_count):
        key, value_type = cursor.string(), cursor.unpack("<I")
        if value_type in _SCALARS:
            fields[key] = cursor.unpack(_SCALARS[value_type])
        elif value_type == _STRING:
            fields[key] = cursor.string()
        else:
            cursor.skip_value(value_type)
            fields[key] = None
    table = []
    for _ in range(tensor_count):
        name, dims = cursor.string(), cursor.unpack("<I")
        shape = tuple(cursor.unpack("<Q") for _ in range(dims))
        table.append((name, shape, cursor.unpack("<I"), cursor.unpack("<Q")))
    alignment = int(fields.get("general.alignment") or 32)
    start = -(-cursor.pos // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in table:
        try:
            tensor_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise ValueError(f"GGUF tensor {name!r} has unknown type {type_id}: path={path!r}") from None
        type_name = tensor_type.name
        per_block, block_bytes = GGML_QUANT_SIZES[tensor_type]
        columns = int(shape[0])
        rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        row_bytes = columns // per_block * block_bytes
        end = start + offset + rows * row_bytes
        if end > mapped.shape[0]:
            raise ValueError(f"truncated GGUF file: tensor {name!r} ends at byte {end}, the file has "
                             f"{mapped.shape[0]}: path={path!r}")
        raw = mapped[start + offset:end].reshape(rows, row_bytes)
        if type_name in _ELEMENTS:
            raw = raw.view(_ELEMENTS[type_name]).reshape(*reversed(shape))
        tensors.append(GGUFTensor(name, type_id, type_name, tuple(int(d) for d in shape), raw))
    return GGUFFile(version, fields, tensors)
