"""Read R's XDR serialization and lazy-load databases (``.rdx`` index, ``.rdb`` values).

Enough of the format (versions 2 and 3) for the character vectors of an R data package, such
as janeaustenr's novels; nothing is evaluated.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RDataError(ValueError):
    """A file that is not R serialization or a lazy-load database as this reader knows it."""


NILVALUE_SXP, REFSXP, PERSISTSXP, PACKAGESXP, NAMESPACESXP = 254, 255, 247, 248, 249
ALTREP_SXP, ATTRLISTSXP, ATTRLANGSXP = 238, 239, 240
_SPECIAL_SXP = {253, 252, 251, 250, 242, 241}  # global/base/empty envs, unbound, missing
_PAIRLIST_SXP = {2, 3, 5, 6, 17, ATTRLISTSXP, ATTRLANGSXP}  # LIST, CLO, PROM, LANG, DOT
SYMSXP, ENVSXP, SPECIALSXP, BUILTINSXP, CHARSXP = 1, 4, 7, 8, 9
LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 10, 13, 14, 15, 16
VECSXP, EXPRSXP, EXTPTRSXP, WEAKREFSXP, RAWSXP, S4SXP = 19, 20, 22, 23, 24, 25
_LATIN1_MASK = 1 << 2


@dataclass
class RObject:
    """A decoded R object: its SEXP type, value and attributes (tag -> value)."""

    sexptype: int
    value: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class RSymbol:
    """An R symbol (name)."""

    name: str


class RUnserializer:
    """Minimal reader for R's XDR binary serialization format (versions 2 and 3)."""

    def __init__(self, data: bytes, source: str = "<bytes>"):
        self.data, self.pos, self.source = data, 0, source
        self.refs: list[Any] = []

    def error(self, message: str) -> RDataError:
        """Build an error naming the source and byte offset."""
        return RDataError(f"{self.source}: R serialization at byte {self.pos}: {message}")

    def _int(self) -> int:
        if self.pos + 4 > len(self.data):
            raise self.error("unexpected end of data")
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _length(self) -> int:
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.error(f"bad length {n}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def read(self) -> Any:
        """Read the header and the one top-level object."""
        if self._take(2) != b"X\n":
            raise self.error("not XDR binary serialization (expected 'X\\n')")
        version = self._int()
        self._int(), self._int()  # writer R version, minimal reader version
        if version == 3:
            self._take(self._int())  # native encoding name
        elif version != 2:
            raise self.error(f"unsupported serialization version {version}")
        return self.item()

    def _attributes(self, has_attr: bool) -> dict[str, Any]:
        if not has_attr:
            return {}
        pairs = self.item()
        return dict(pairs.value) if isinstance(pairs, RObject) else {}

    def _pairlist(self, flags: int) -> RObject:
        """Read a pairlist iteratively (CDR chains can be long) as [(tag, car), ...]."""
        head = RObject(flags & 0xFF, [])
        while True:
            attrs = self._attributes(bool(flags & (1 << 9)))
            if attrs and not head.attributes:
                head.attributes = attrs
            tag = self.item() if flags & (1 << 10) else None
            car = self.item()
            head.value.append((tag.name if isinstance(tag, RSymbol) else tag, car))
            flags = self._int()
            if flags & 0xFF not in _PAIRLIST_SXP:
                self.pos -= 4
                self.item()  # the terminating CDR, normally NULL
                return head

    def item(self) -> Any:  # noqa: C901 - one branch per SEXP type
        """Read one serialized R object."""
        flags = self._int()
        sexptype, has_attr = flags & 0xFF, bool(flags & (1 << 9))
        if sexptype == NILVALUE_SXP:
            return None
        if sexptype in _SPECIAL_SXP:
            return RObject(sexptype)
        if sexptype == REFSXP:
            index = flags >> 8 or self._int()
            if not 0 < index <= len(self.refs):
                raise self.error(f"reference {index} out of range")
            return self.refs[index - 1]
        if sexptype == SYMSXP:
            sym = RSymbol(self.item() or "")
            self.refs.append(sym)
            return sym
        if sexptype in (PERSISTSXP, PACKAGESXP, NAMESPACESXP):
            self._int()
            obj = RObject(sexptype, [self.item() for _ in range(self._int())])
            self.refs.append(obj)
            return obj
        if sexptype == ENVSXP:
            self._int()  # locked
            env = RObject(ENVSXP, {})
            self.refs.append(env)
            env.value = {"enclos": self.item(), "frame": self.item(), "hashtab": self.item()}
            env.attributes = self._attributes(True)
            return env
        if sexptype in _PAIRLIST_SXP:
            return self._pairlist(flags)
        if sexptype == CHARSXP:
            n = self._int()
            if n == -1:
                return None  # NA_character_
            raw = self._take(n)
            return raw.decode("latin-1" if (flags >> 12) & _LATIN1_MASK else "utf-8", "replace")
        if sexptype in (SPECIALSXP, BUILTINSXP):
            return RObject(sexptype, self._take(self._int()).decode("ascii", "replace"))
        if sexptype == EXTPTRSXP:
            obj = RObject(sexptype)
            self.refs.append(obj)
            obj.value = (self.item(), self.item())
            obj.attributes = self._attributes(has_attr)
            return obj
        if sexptype == WEAKREFSXP:
            obj = RObject(sexptype)
            self.refs.append(obj)
            obj.attributes = self._attributes(has_attr)
            return obj
        if sexptype == ALTREP_SXP:
            return self._altrep()
        return self._vector(sexptype, has_attr)

    def _vector(self, sexptype: int, has_attr: bool) -> RObject:
        if sexptype in (LGLSXP, INTSXP):
            n = self._length()
            value: Any = list(struct.unpack(f">{n}i", self._take(4 * n)))
        elif sexptype == REALSXP:
            n = self._length()
            value = list(struct.unpack(f">{n}d", self._take(8 * n)))
        elif sexptype == CPLXSXP:
            n = self._length()
            flat = struct.unpack(f">{2 * n}d", self._take(16 * n))
            value = [complex(flat[i], flat[i + 1]) for i in range(0, 2 * n, 2)]
        elif sexptype in (STRSXP, VECSXP, EXPRSXP):
            value = [self.item() for _ in range(self._length())]
        elif sexptype == RAWSXP:
            value = self._take(self._length())
        elif sexptype == S4SXP:
            value = None
        else:
            raise self.error(f"unsupported SEXP type {sexptype}")
        return RObject(sexptype, value, self._attributes(has_attr))

    def _altrep(self) -> Any:
        """Expand the ALTREP classes R writes for plain data (compact sequences, wrappers)."""
        info, state, attr = self.item(), self.item(), self.item()
        cls = info.value[0][1].name if isinstance(info, RObject) and info.value else "?"
        attributes = dict(attr.value) if isinstance(attr, RObject) else {}
        if cls in ("compact_intseq", "compact_realseq"):
            n, start, step = state.value[:3]
            seq = [start + i * step for i in range(int(n))]
            kind = INTSXP if cls == "compact_intseq" else REALSXP
            return RObject(kind, [int(x) for x in seq] if kind == INTSXP else seq, attributes)
        if cls.startswith("wrap_") and isinstance(state, RObject):
            inner = state.value[0][1]
            if isinstance(inner, RObject) and attributes:
                inner.attributes = attributes
            return inner
        if cls == "deferred_string" and isinstance(state, RObject):
            arg = state.value[0][1]
            return RObject(STRSXP, [_r_number_str(x) for x in arg.value], attributes)
        raise self.error(f"unsupported ALTREP class {cls}")


def _r_number_str(x: Any) -> str:
    """Format a number as R's as.character would for integers and simple doubles."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def unserialize(data: bytes, source: str = "<bytes>") -> Any:
    """Decode one R-serialized (XDR) object."""
    return RUnserializer(data, source).read()


def _r_names(obj: RObject) -> list[str]:
    names = obj.attributes.get("names")
    return list(names.value) if isinstance(names, RObject) else []


def read_lazyload_index(rdx: Path) -> dict[str, tuple[int, int]]:
    """Read an R lazy-load ``.rdx`` (gzip or zlib'd serialization) -> {variable: (off, len)}."""
    raw = rdx.read_bytes()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:])
    index = unserialize(data, str(rdx))
    if not isinstance(index, RObject) or index.sexptype != VECSXP:
        raise RDataError(f"{rdx}: expected a list, got {index!r:.80}")
    fields = dict(zip(_r_names(index), index.value))
    variables = fields.get("variables")
    if not isinstance(variables, RObject):
        raise RDataError(f"{rdx}: no 'variables' entry")
    return {
        name: (int(pos.value[0]), int(pos.value[1]))
        for name, pos in zip(_r_names(variables), variables.value)
    }


def read_lazyload_value(rdb: Path, offset: int, length: int) -> Any:
    """Decompress and decode one value of an R lazy-load ``.rdb`` file."""
    with rdb.open("rb") as f:
        f.seek(offset)
        blob = f.read(length)
    if len(blob) != length or length < 5:
        raise RDataError(f"{rdb}: cannot read {length} bytes at {offset}")
    (size,) = struct.unpack(">I", blob[:4])
    kind, body = blob[4:5], blob[5:]
    try:
        if kind == b"Z":
            data = lzma.decompress(body)
        elif kind == b"2":
            data = bz2.decompress(body)
        elif kind == b"0":
            data = body
        else:  # type 1: a plain zlib stream right after the length
            data = zlib.decompress(blob[4:])
    except (zlib.error, lzma.LZMAError, OSError) as err:
        raise RDataError(f"{rdb}: value at {offset}: {err}") from err
    if len(data) != size:
        raise RDataError(f"{rdb}: value at {offset} is {len(data)} bytes, header says {size}")
    return unserialize(data, f"{rdb}@{offset}")
