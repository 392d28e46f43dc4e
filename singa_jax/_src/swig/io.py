"""SINGA's C++ ``io::Snapshot``: named tensors in SINGA's binary snapshot format.

A snapshot ``prefix`` is two files, written byte for byte as SINGA's ``BinFileWriter`` and
``TextFileWriter`` write them:

* ``prefix.bin``: one record per tensor, ``b"sg\\x01\\x00"`` (magic; the third byte says a key
  follows), key length (8-byte little-endian ``size_t``), key bytes, value length (8 bytes),
  value: a serialised ``singa.TensorProto`` (core.proto: ``shape`` = 1, ``data_type`` = 2,
  ``stride`` = 3, packed ``float_data`` = 4, ``double_data`` = 5, ``int_data`` = 6), in field
  order as protobuf's C++ serialiser emits them. Records without a key (third magic byte 0)
  are read and skipped, as SINGA's reader allows.
* ``prefix.desc``: ``SINGA VERSION: 5100``, then one line per tensor
  ``parameter name: <key>\\tdata type: <enum>\\tdim: <n>\\tshape: <d0> <d1> ...``.

Like SINGA, only float32 (kFloat32), int32 (kInt) and float64 (kDouble) tensors can be stored.
Reading falls back to ``prefix.model`` (SINGA 1.0.0's name) when ``prefix.bin`` is missing.
Deviations: tensors are returned in file order (SINGA returns its hash map's order); stored
strides other than row-major are honoured when reading; float64 data becomes float32 unless
JAX's x64 mode is on; ``max_param_size`` bounds records on write (as SINGA's buffer does) but
not on read.
"""
from __future__ import annotations

import struct
from typing import BinaryIO, Iterator, List, Optional, TextIO, Tuple, Union

import numpy as np

from singa_jax._src.runtime.ctensor import CTensor, as_array

__all__ = ["Snapshot", "encode_tensor_proto", "decode_tensor_proto"]

SINGA_VERSION = 5100  # SINGA_MAJOR * 1000 + SINGA_MINOR * 100 + SINGA_PATCH of SINGA 5.1.0
_MAGIC_WITH_KEY = b"sg\x01\x00"
_SIZE_T = struct.Struct("<Q")
# core.proto's DataType codes that TensorProto can carry, and their NumPy types
_PROTO_DTYPES = {0: np.dtype("<f4"), 2: np.dtype("<i4"), 4: np.dtype("<f8")}
_PROTO_CODES = {np.dtype("float32"): 0, np.dtype("int32"): 2, np.dtype("float64"): 4}


# --- protobuf wire format (only what TensorProto needs) ------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 values are encoded as 64-bit two's complement
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("Snapshot: truncated varint in a TensorProto")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _int32(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n & 0x80000000 else n


def _row_major_strides(shape: Tuple[int, ...]) -> List[int]:
    """SINGA's ``generate_stride``: elements to skip per axis; [1] for a scalar."""
    if not shape:
        return [1]
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return strides[::-1]


def encode_tensor_proto(values: np.ndarray) -> bytes:
    """``values`` serialised as SINGA's ``Tensor::ToProto`` + ``SerializeToString``."""
    dtype = np.dtype(values.dtype)
    if dtype not in _PROTO_CODES:
        raise TypeError(f"Snapshot: SINGA's format stores float32, int32 and float64 tensors, "
                        f"got {dtype}")
    code = _PROTO_CODES[dtype]
    out = bytearray()
    for dim in values.shape:
        out += b"\x08" + _varint(int(dim))
    out += b"\x10" + _varint(code)
    for stride in _row_major_strides(values.shape):
        out += b"\x18" + _varint(stride)
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.size:
        if code == 2:  # int_data: packed varints
            payload = b"".join(_varint(int(v)) for v in flat.tolist())
            tag = b"\x32"
        else:          # float_data / double_data: packed little-endian
            payload = flat.astype(_PROTO_DTYPES[code]).tobytes()
            tag = b"\x22" if code == 0 else b"\x2a"
        out += tag + _varint(len(payload)) + payload
    return bytes(out)


def _fields(buf: bytes) -> Iterator[Tuple[int, int, Union[int, bytes]]]:
    """(field number, wire type, value) of every field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"Snapshot: unsupported protobuf wire type {wire} (field {field})")
        if pos > len(buf):
            raise ValueError("Snapshot: truncated TensorProto")
        yield field, wire, value


def decode_tensor_proto(buf: bytes) -> np.ndarray:
    """A NumPy array from a serialised SINGA ``TensorProto`` (packed or unpacked repeated
    fields, as any protobuf parser accepts)."""
    shape: List[int] = []
    strides: List[int] = []
    code = 0
    floats, doubles, ints = [], [], []
    for field, wire, value in _fields(buf):
        if field == 1:
            shape.extend(_unpack_varints(value) if wire == 2 else [value])
        elif field == 2:
            code = value
        elif field == 3:
            strides.extend(_int32(v) for v in (_unpack_varints(value) if wire == 2 else [value]))
        elif field == 4:
            floats.append(np.frombuffer(value, "<f4") if wire == 2 else
                          np.frombuffer(value, "<f4", 1))
        elif field == 5:
            doubles.append(np.frombuffer(value, "<f8") if wire == 2 else
                           np.frombuffer(value, "<f8", 1))
        elif field == 6:
            ints.extend(_int32(v) for v in (_unpack_varints(value) if wire == 2 else [value]))
    if code not in _PROTO_DTYPES:
        raise TypeError(f"Snapshot: SINGA's reader supports data types kFloat32, kInt and kDouble "
                        f"(0, 2, 4), the file holds data type {code}")
    size = int(np.prod(shape, dtype=np.int64))
    if code == 0:
        data = np.concatenate(floats) if floats else np.zeros(0, "<f4")
    elif code == 4:
        data = np.concatenate(doubles) if doubles else np.zeros(0, "<f8")
    else:
        data = np.asarray(ints, np.int32)
    data = data.astype(_PROTO_DTYPES[code].newbyteorder("="))
    if strides and strides != _row_major_strides(tuple(shape)) and size:
        # SINGA stores a transposed/broadcast tensor's memory with its strides: gather it
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        if data.size < span:
            raise ValueError(f"Snapshot: {data.size} values cannot fill shape {shape} with "
                             f"strides {strides}")
        index = sum(np.arange(d).reshape([-1 if i == a else 1 for i in range(len(shape))]) * s
                    for a, (d, s) in enumerate(zip(shape, strides)))
        return data[index]
    if data.size != size:
        raise ValueError(f"Snapshot: a tensor of shape {tuple(shape)} needs {size} values, the "
                         f"file holds {data.size}")
    return data.reshape(shape)


def _unpack_varints(buf: bytes) -> List[int]:
    values, pos = [], 0
    while pos < len(buf):
        v, pos = _read_varint(buf, pos)
        values.append(v)
    return values


# --- the snapshot files ---------------------------------------------------------------------------
def _text(s: Union[str, bytes]) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


class Snapshot:
    """SINGA's ``singa::Snapshot(prefix, mode, max_param_size=10)``.

    ``mode`` is ``Snapshot.kWrite`` (1, or True as SINGA's Python passes it) or ``kRead``
    (0/False). Read mode loads every tensor at construction; ``Read()`` returns
    ``[(name, CTensor), ...]``. Write mode creates ``prefix.bin``/``prefix.desc``;
    ``Write(name, tensor)`` appends one record and flushes it, so the files are complete after
    every call (``close()`` or a ``with`` block releases them).
    """

    kRead = 0
    kWrite = 1

    def __init__(self, prefix: Union[str, bytes], mode: Union[int, bool],
                 max_param_size: int = 10):
        if int(mode) not in (self.kRead, self.kWrite):
            raise ValueError(f"Snapshot: mode must be kRead (0/False) or kWrite (1/True), got "
                             f"{mode!r}")
        if int(max_param_size) < 1:
            raise ValueError(f"Snapshot: max_param_size (MB) must be >= 1, got {max_param_size}")
        self.prefix = _text(prefix)
        self.mode = int(mode)
        self.capacity = int(max_param_size) << 20  # bytes, as SINGA's buffer
        self._names: set = set()
        self._bin: Optional[BinaryIO] = None
        self._desc: Optional[TextIO] = None
        self._params: List[Tuple[str, np.ndarray]] = []
        if self.mode == self.kWrite:
            self._bin = open(self.prefix + ".bin", "wb")
            self._desc = open(self.prefix + ".desc", "w")
            self._desc.write(f"SINGA VERSION: {SINGA_VERSION}\n")
            self._desc.flush()
        else:
            self._params = self._load()

    def _load(self) -> List[Tuple[str, np.ndarray]]:
        for path in (self.prefix + ".bin", self.prefix + ".model"):
            try:
                with open(path, "rb") as f:
                    buf = f.read()
                break
            except FileNotFoundError:
                continue
        else:
            raise FileNotFoundError(f"Snapshot: cannot open the checkpoint file {self.prefix}.bin "
                                    f"(SINGA >= 1.0.1) or {self.prefix}.model (SINGA 1.0.0)")
        params, pos = [], 0
        while pos < len(buf):
            magic = buf[pos:pos + 4]
            if len(magic) < 4 or magic[:2] != b"sg" or magic[2] not in (0, 1):
                raise ValueError(f"Snapshot: {path} is not a SINGA snapshot (bad magic word at "
                                 f"byte {pos})")
            pos += 4
            key = ""
            if magic[2] == 1:
                raw, pos = self._field(buf, pos, path)
                key = raw.decode()
            value, pos = self._field(buf, pos, path)
            if magic[2] == 0:
                continue  # a keyless record: not a parameter
            if key in self._names:
                raise ValueError(f"Snapshot: {path} holds the parameter {key!r} twice")
            self._names.add(key)
            params.append((key, decode_tensor_proto(value)))
        return params

    @staticmethod
    def _field(buf: bytes, pos: int, path: str) -> Tuple[bytes, int]:
        if pos + 8 > len(buf):
            raise ValueError(f"Snapshot: {path} is truncated at byte {pos}")
        (n,) = _SIZE_T.unpack_from(buf, pos)
        pos += 8
        if pos + n > len(buf):
            raise ValueError(f"Snapshot: {path} is truncated at byte {pos} (a field of {n} bytes)")
        return buf[pos:pos + n], pos + n

    def Read(self) -> List[Tuple[str, CTensor]]:
        """Every (name, CTensor) of the snapshot, in file order."""
        if self.mode != self.kRead:
            raise RuntimeError("Snapshot.Read: this snapshot was opened for writing")
        return [(name, CTensor.from_array(values)) for name, values in self._params]

    def ReadShape(self) -> List[Tuple[str, Tuple[int, ...]]]:
        if self.mode != self.kRead:
            raise RuntimeError("Snapshot.ReadShape: this snapshot was opened for writing")
        return [(name, tuple(values.shape)) for name, values in self._params]

    def Write(self, key: Union[str, bytes], param: object) -> None:
        """Append ``param`` (a CTensor or an array) under the name ``key``."""
        if self.mode != self.kWrite or self._bin is None:
            raise RuntimeError("Snapshot.Write: this snapshot was opened for reading or closed")
        name = _text(key)
        if name in self._names:
            raise ValueError(f"Snapshot.Write: the parameter {name!r} was already written")
        values = np.asarray(as_array(param, "Snapshot.Write"))
        value = encode_tensor_proto(values)
        raw_key = name.encode()
        record = (_MAGIC_WITH_KEY + _SIZE_T.pack(len(raw_key)) + raw_key +
                  _SIZE_T.pack(len(value)) + value)
        if len(record) > self.capacity:
            raise ValueError(f"Snapshot.Write: {name!r} takes {len(record)} bytes, more than the "
                             f"buffer of {self.capacity >> 20} MB; use a larger buffer_size")
        self._names.add(name)
        self._bin.write(record)
        self._bin.flush()
        dims = "".join(f" {d}" for d in values.shape)
        self._desc.write(f"parameter name: {name}\tdata type: {_PROTO_CODES[values.dtype]}\t"
                         f"dim: {values.ndim}\tshape:{dims}\n")
        self._desc.flush()

    def close(self) -> None:
        for f in (self._bin, self._desc):
            if f is not None:
                f.close()
        self._bin = self._desc = None

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: files may already be gone
            pass
