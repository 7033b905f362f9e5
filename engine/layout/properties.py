"""Java ``Properties`` text format, as ``hoodie.properties`` and ``.hoodie_partition_metadata`` use.

Java writes ISO-8859-1 with ``\\uXXXX`` escapes for other characters and escapes ``:``,
``=``, ``#``, ``!`` and backslash in keys and values; we write exactly that so a Java
reader's checksum and parsing agree with ours.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping

_ESCAPES = {"\\": "\\\\", ":": "\\:", "=": "\\=", "#": "\\#", "!": "\\!",
            "\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}


def _escape(text: str, *, is_key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch == " " and (is_key or i == 0):
            out.append("\\ ")
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            code = ord(ch)
            if code > 0xFFFF:  # Java escapes UTF-16 code units: a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}")
            else:
                out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    return "".join(out)


def dumps(props: Mapping[str, str], *, comment: str | None = None,
          last_key: str | None = None) -> str:
    """Serialize ``props`` as Java does; ``last_key`` (e.g. the checksum) is written last."""
    now = _dt.datetime.now(_dt.timezone.utc)
    lines = []
    if comment:
        lines.append(f"#{comment}")
    lines.append("#" + now.strftime("%a %b %d %H:%M:%S UTC %Y"))
    keys = [k for k in props if k != last_key]
    if last_key is not None and last_key in props:
        keys.append(last_key)
    for key in keys:
        lines.append(f"{_escape(key, is_key=True)}={_escape(props[key], is_key=False)}")
    return "\n".join(lines) + "\n"


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text  # nothing escaped (most keys and values): no character walk
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and i + 6 <= len(text):
            out.append(chr(int(text[i + 2:i + 6], 16)))
            i += 6
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
        i += 2
    # Re-join surrogate pairs produced by \\uD8xx\\uDCxx escapes.
    return "".join(out).encode("utf-16", "surrogatepass").decode("utf-16")


def loads(text: str) -> dict[str, str]:
    """Parse Java properties text (comments, ``=``/``:`` separators, escapes, continuations)."""
    result: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.lstrip() if pending else raw.lstrip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        # A line ending in an odd number of backslashes continues on the next line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = line[:-1]
            continue
        logical.append(line)
    for line in logical:
        if "\\" not in line:  # no escapes: the key ends at the first separator
            cut = min((at for at in map(line.find, "=: \t") if at >= 0), default=len(line))
            key, rest = line[:cut], line[cut:].lstrip(" \t")
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t")
            result[key] = rest
            continue
        i = 0
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] in "=: \t":
                break
            i += 1
        key = line[:i]
        rest = line[i:].lstrip(" \t")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t")
        result[_unescape(key)] = _unescape(rest)
    return result
