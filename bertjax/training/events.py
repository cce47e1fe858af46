"""A minimal TensorBoard event-file writer for scalars (no TensorFlow needed).

Writes the TFRecord framing (length, masked CRC-32C of the length, data, masked
CRC-32C of the data) around hand-encoded `Event` protocol buffers holding
`Summary.Value(tag, simple_value)`, which TensorBoard reads like any other run.
"""

from __future__ import annotations

import pathlib
import socket
import struct
import time


def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of `data`."""
  c = 0xFFFFFFFF
  for b in data:
    c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
  return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
  c = crc32c(data)
  return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
  return _varint((num << 3) | wire) + payload


def _bytes_field(num: int, data: bytes) -> bytes:
  return _field(num, 2, _varint(len(data)) + data)


def _event(
  step: int,
  wall_time: float,
  *,
  file_version: str | None = None,
  values: dict[str, float] | None = None,
) -> bytes:
  msg = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
  if file_version is not None:
    msg += _bytes_field(3, file_version.encode())
  if values:
    summary = b"".join(
      _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", v)))
      for tag, v in values.items()
    )
    msg += _bytes_field(5, summary)
  return msg


class EventWriter:
  """Appends scalar summaries to an ``events.out.tfevents.*`` file in `logdir`."""

  def __init__(self, logdir: str | pathlib.Path):
    self.logdir = pathlib.Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
    self._file = open(self.logdir / name, "ab")  # noqa: SIM115 (closed by close())
    self._write(_event(0, time.time(), file_version="brain.Event:2"))

  def _write(self, data: bytes) -> None:
    header = struct.pack("<Q", len(data))
    self._file.write(
      header + struct.pack("<I", _masked(header)) + data + struct.pack("<I", _masked(data))
    )

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """Writes one event with the given scalar values at `step`."""
    self._write(_event(int(step), time.time(), values={k: float(v) for k, v in values.items()}))
    self._file.flush()

  def close(self) -> None:
    """Closes the event file."""
    self._file.close()
