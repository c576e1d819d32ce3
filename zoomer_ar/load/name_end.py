"""Where an event name that PyTorch's profiler did not escape ends (load/repair.py re-escapes its text).

The profiler writes `"name": "<raw text>"` and then the event's other members: the raw text may hold
quotes, so the name ends at one of the quotes after its start. `name_end` takes the first candidate
after which the bytes read as JSON again (`follows`): the name's other members, the events after it, up
to the next name (read on its own) or the end of the line (of the next line, where the name's ends with
a comma: the one-key-a-line layout puts `"pid":` there). The candidates are the end of the text
read as a valid JSON string (a name that needs no repair, whatever members follow: older Kineto's
instant events carry `"ph": "i", "s": "g"` after it) and each quote on the name's line that the writers'
key orders put after a name (`ends`): `"pid":` next (Kineto's events); the end of the name's object on the
next line (Kineto's thread and process names, the last member of their args); `"ph":` next, for a name that
opens its object (torch's EventList export, on one line; older Kineto's metadata events). So three events on
one line, the middle one's name `f("a")`, stay three events: each name ends at the first `"pid":` after which
the bytes read as JSON, not at the line's last.

A text is not guessed at where it cannot be told apart from the structure around it:
- an end beyond another `"name":` key is not taken where the text before that key could have ended at
  a quote after which the bytes read as JSON up to the key: `f("a"}, {"ph": "X", "name": "b")` is one
  name or two events;
- the text as written is not read as a valid string followed by members that repeat a key of its object
  (`x", "pid": 1, "k": "v` then `", "pid": 1, ...`: the later end is taken), nor, where the name's object
  opened on an earlier line (Kineto's layouts: an event over several lines), as a valid string followed
  by the end of its object and another event on the same line (`a", "pid": 1}, {"name": "b`).
Where no end is left the text stays as written: AmbiguousName where those bytes would read as valid JSON,
else the decoder refuses them; the caller refuses the file either way. A document written one event on a
line or all on one line cannot tell `a", "pid": 1}, {"name": "b` from two events: bytes that read as valid
JSON there are read as written, as every JSON reader reads them."""

from __future__ import annotations

import re
from collections.abc import Iterator

# where a name's text starts (`"name": "`, or `"name":"` from a compact writer)
NAME_START = re.compile(rb'"name":[ \t]*"')
# where the profiler's layout ends a name: `",` then `"pid":` (Kineto's key order: ph, cat, name, pid, tid,
# ts, dur, args), on the same line or - since 2025 - on the next one
PID_END = re.compile(rb'",[ \t]*\n?[ \t]*"pid":')
# the closing quotes the writers' layouts put after a name (ENDS), by what follows them: `", "pid":` as above;
# the quote that ends its line where its object's `}` starts the next one (Kineto's thread and process names:
# `"args": {\n  "name": "thread 7 (<the OS thread's name>)"\n }`); for a name that opens its object
# (ENDS_FIRST), also `", "ph":` on its line: torch's EventList.export_chrome_trace (`{"name": "...", "ph": "X",
# "ts": ...}` on one line: `prof.events().export_chrome_trace()`, a profiler without Kineto) and older Kineto's
# metadata and instant events. A name elsewhere is not ended at `"ph":`: Kineto writes it before the name.
_PID_NEXT, _OBJECT_END = rb',[ \t]*\n?[ \t]*"pid":', rb'[ \t\r]*\n[ \t]*\}'
ENDS = re.compile(rb'"(?=' + _PID_NEXT + rb"|" + _OBJECT_END + rb")")
ENDS_FIRST = re.compile(rb'"(?=' + _PID_NEXT + rb"|" + _OBJECT_END + rb'|,[ \t]*"ph":)')
# a valid JSON string body: no raw quote, backslash only in an escape, no control character
_CHARS = rb'[^"\\\x00-\x1f]*+'
_BODY = _CHARS + rb'(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})' + _CHARS + rb")*+"
VALID = re.compile(_BODY)

_WS = re.compile(rb"[ \t\r]*")
_STRING = re.compile(rb'"' + _BODY + rb'"')
_RAW_STRING = re.compile(rb'"[^\n"]*"')  # a call stack as old Kineto wrote it (repair.py's second pass)
_NUMBER = rb"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][+-]?[0-9]++)?"
_SCALAR = re.compile(_NUMBER + rb"|true|false|null")
_NAME_KEY, _CALL_STACK_KEY = b'"name"', b'"Call stack"'
QUOTE, COMMA, COLON, NEWLINE = ord('"'), ord(","), ord(":"), ord("\n")
OPEN_OBJECT, CLOSE_OBJECT, OPEN_ARRAY, CLOSE_ARRAY = ord("{"), ord("}"), ord("["), ord("]")


def _member(g: str, k: int, first: bool = False) -> bytes:
    """_USUAL's k-th member (group g<k>: its key): a key that is not `name`, not `Call stack` (read
    leniently), none of the keys before it; then a value, or the `{` or `[` that ends its line."""
    others = b"".join(rb'|(?P=%s%d)"' % (g.encode(), j) for j in range(k))
    key = rb'"(?!name"|Call stack"' + others + rb")(?P<%s%d>" % (g.encode(), k) + _CHARS + rb')"[ \t]*:[ \t]*'
    return (b"" if first else rb"[ \t]*,[ \t]*") + key + rb"(?:" + _VALUE + rb"|[{\[](?=[ \t\r]*(?:\n|\Z)))"


def _members(g: str, first: int, last: int, lead: bool) -> bytes:
    """Members first..last-1 of a line (the first one required, after a comma where `lead`)."""
    more = b"".join(rb"(?:" + _member(g, k) + rb")?" for k in range(first + 1, last))
    return rb"(?>" + _member(g, first, not lead) + more + rb")"  # atomic: fewer members would not do either


# what most often follows a valid name, read in one match (what `follows` reads as OK): one to five members
# with different keys on its line (and where it ends with a comma, on the next), the one-key-a-line layout's
# `",` and `"pid": 1,` on the next line, or the end of its object on the next line
_VALUE = rb'(?:"' + _BODY + rb'"|' + _NUMBER + rb"|true|false|null)"
_LINE_END = rb"[ \t]*,?[ \t\r]*(?:\n|\Z)"
_USUAL_AFTER = (rb'"(?:' + _members("k", 0, 5, True) + rb"(?:[ \t]*,[ \t\r]*\n[ \t]*" + _members("k", 5, 10, False)
                + _LINE_END + rb"|[ \t\r]*(?:\n|\Z))"
                + rb"|[ \t]*,[ \t\r]*\n[ \t]*" + _members("n", 0, 5, False) + _LINE_END
                + rb"|[ \t\r]*\n[ \t]*\}" + _LINE_END + rb")")
_USUAL = re.compile(_USUAL_AFTER)
# a name's start; where a valid text without a quote (no `"pid":` end can come before its end) is followed by
# the usual, that text too, in the same match: group 1 marks where the text starts, group 2 is the text
NAMES = re.compile(rb'"name":[ \t]*"()(?:(' + _CHARS + rb"(?:\\(?:[\\/bfnrt]|u[0-9a-fA-F]{4})" + _CHARS + rb")*+)(?="
                   + _USUAL_AFTER + rb"))?")

OK, REPEATS, FOREIGN, BAD = 0, 1, 2, 3  # what `follows` makes of the bytes after a candidate end
BACK = 4096  # how far before a name its object's `{` is looked for, on the name's line
MAX_TEXT = 64 << 20  # the longest name text read: an end further on is not looked for (repair.MAX_LINE)
# what the bytes read next: a member's key (FIRST_KEY: or `}`), a value (FIRST_VALUE: or `]`), a key or
# a value (after a comma outside the name's object: an object's or an array's), a colon, or what comes
# after a value (a comma, or the end of its object or array)
KEY, FIRST_KEY, VALUE, FIRST_VALUE, KEY_OR_VALUE, COLON_NEXT, AFTER = range(7)


class AmbiguousName(ValueError):
    """A name the profiler did not escape whose end cannot be told apart from the members around it."""


def follows(data: bytes, quote: int, start: int, reading: Reading | None = None) -> int:
    """What the bytes after a name's candidate closing quote read as: OK where they are the JSON that may
    follow a member's value (more members, the end of the name's object, the events after it) up to the
    next `"name":` key (whose text is read on its own) or the end of the line - of the next line, where
    the quote's ends with a comma (the one-key-a-line layout: `"pid":` on the next line; the streaming
    repair holds both); REPEATS where they are, but repeat a key of the name's object (a second
    `"name"` in it included); FOREIGN where they end the name's object and reach another object's name on
    the same line while the name's object opened on an earlier line (events over several lines: such bytes
    are not the layout's; `start`: where the name's text starts); BAD otherwise. A truncated document
    reads OK to its end. With `reading` (to whom REPEATS means BAD: any end but the valid text's), a repeated
    key ends the reading at once, and its steps count against the name's budget (Reading)."""
    frames: list[set[bytes] | None] = [{_NAME_KEY}]  # open containers: an object's keys, or None (array)
    state, key, repeats, closed, next_line, i, n = AFTER, b"", False, False, True, quote + 1, len(data)
    early = reading is not None
    steps, last, limit = 0, i, (reading.left if early else 0)
    try:
        while True:
            if early:
                steps += 1 + ((i - last) >> 6)  # a token, and 64 bytes of a long one (a string, blanks)
                last = i
                if steps >= limit:
                    raise AmbiguousName("an event name whose end would take too long to tell apart from the "
                                        "members around it")
                if repeats:
                    return REPEATS
            i = _WS.match(data, i).end()
            if i >= n:
                return REPEATS if repeats else OK
            c = data[i]
            if c == NEWLINE:  # the end of what is read, unless the name's line ends with a comma: then the next
                if not (next_line and _comma_before(data, quote, i)):
                    return REPEATS if repeats else OK
                next_line, i = False, i + 1
            elif state == AFTER:
                if c == COMMA:
                    state = KEY_OR_VALUE if not frames else VALUE if frames[-1] is None else KEY
                elif c in (CLOSE_OBJECT, CLOSE_ARRAY):
                    if frames and (frames.pop() is None) != (c == CLOSE_ARRAY):
                        return BAD
                    closed = closed or not frames
                else:
                    return BAD
                i += 1
            elif state == COLON_NEXT:
                if c != COLON:
                    return BAD
                state, i = VALUE, i + 1
            elif c == QUOTE:
                keyed = state in (KEY, FIRST_KEY, KEY_OR_VALUE)
                if keyed and NAME_START.match(data, i):  # the next name: read on its own
                    keys = frames[-1] if frames else None
                    if repeats or (keys is not None and _NAME_KEY in keys):
                        return REPEATS
                    foreign = closed and data.find(b"\n", quote, i) < 0
                    return FOREIGN if foreign and not _opened_on_its_line(data, start) else OK
                m = (_RAW_STRING if state == VALUE and key == _CALL_STACK_KEY else _STRING).match(data, i)
                if m is None:  # not a string: BAD, unless the document ends in it (truncated)
                    return OK if data.find(b'"', i + 1) < 0 and data.find(b"\n", i + 1) < 0 else BAD
                i = m.end()
                if state == KEY_OR_VALUE:  # a key of an object around the name's, or an item of an array
                    j = _WS.match(data, i).end()
                    state = COLON_NEXT if j < n and data[j] == COLON else AFTER
                    key = m.group()
                elif keyed:
                    keys, key = frames[-1], m.group()
                    if keys is not None:
                        repeats = repeats or key in keys
                        keys.add(key)
                    state = COLON_NEXT
                else:
                    state = AFTER
            elif state in (KEY, FIRST_KEY):
                if c != CLOSE_OBJECT or state != FIRST_KEY:
                    return BAD
                frames.pop()
                state, i = AFTER, i + 1
            elif c == OPEN_OBJECT:
                frames.append(set())
                state, i = FIRST_KEY, i + 1
            elif c == OPEN_ARRAY:
                frames.append(None)
                state, i = FIRST_VALUE, i + 1
            elif c == CLOSE_ARRAY and state == FIRST_VALUE:
                frames.pop()
                state, i = AFTER, i + 1
            elif (m := _SCALAR.match(data, i)) is not None:
                state, i = AFTER, m.end()
            else:
                return BAD
    finally:
        if early:
            reading.left -= steps


def _comma_before(data: bytes, quote: int, i: int) -> bool:
    """Does data[quote + 1 : i] end with a comma, blanks aside (without copying a long line)?"""
    j = i - 1
    while j > quote and data[j] in b" \t\r":
        j -= 1
    return j > quote and data[j] == COMMA


def _before(data: bytes, at: int) -> int:
    """The byte before `at`, blanks aside (-1 at the start)."""
    i = at - 1
    while i >= 0 and data[i] in b" \t\r\n":
        i -= 1
    return data[i] if i >= 0 else -1


def key_at(data: bytes, at: int) -> bool:
    """Is `at` where an object's key may start (after `{` or `,`)?"""
    return _before(data, at) in (OPEN_OBJECT, COMMA)


def ends(data: bytes, start: int, lo: int, hi: int) -> Iterator[re.Match]:
    """The closing quotes in data[lo:hi] that the writers' layouts put after the text of the name that starts at
    `start` (ENDS, or ENDS_FIRST where the name opens its object: `{` before its key)."""
    key = data.rfind(_NAME_KEY, max(0, start - 64), start)
    first = key >= 0 and _before(data, key) == OPEN_OBJECT
    return (ENDS_FIRST if first else ENDS).finditer(data, lo, hi)


def _opened_on_its_line(data: bytes, start: int) -> bool:
    """Did the object of the name whose text starts at `start` open on the name's line (a `{` before it on
    its line, within BACK bytes)? A buffer that starts at the name's line gives the same answer."""
    lo = max(0, start - BACK)
    return data.rfind(b"{", lo, start) > data.rfind(b"\n", lo, start)


READ_BUDGET = 1 << 20  # follows' steps for one name, all its candidate ends together (about a second)


class Reading:
    """The reading of the ends of one name whose text starts at `start` (name_end, repair's _name_at): where
    the text was searched for another event's start so far (each `"name":` key, each quote before it, is
    looked at once: a text holding thousands of them took minutes), and the steps `follows` may still take
    (READ_BUDGET; beyond it AmbiguousName: a text built so that each candidate end reads far as JSON is
    refused, where it took hours). To it, REPEATS and BAD mean the same: no end there."""

    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.start = data, start
        self.left = READ_BUDGET
        self._keys_to = self._quotes_to = start  # the keys, and the quotes, before these were looked at

    def follows(self, quote: int) -> int:
        return follows(self.data, quote, self.start, self)

    def opens_another(self, end: int) -> bool:
        """Does the text data[start:end] hold another event's start: a `"name":` key before which the text
        could have ended (a quote after which the bytes read as JSON up to that key)?"""
        data = self.data
        for key in NAME_START.finditer(data, self._keys_to, end):
            if key_at(data, key.start()) and self._could_open(key.start()):
                return True
        self._keys_to = max(self._keys_to, end)
        return False

    def _could_open(self, key: int) -> bool:
        data = self.data
        q = data.find(b'"', self._quotes_to, key)
        while q >= 0:  # what follows a quote does not depend on the key: those before the last key read no end
            if self.follows(q) in (OK, FOREIGN):
                return True
            q = data.find(b'"', q + 1, key)
        self._quotes_to = max(self._quotes_to, key)
        return False


def name_end(data: bytes, start: int) -> int | None:
    """The closing quote of the name whose text starts at `start` (see the module's doc), or None where
    no end fits, or where the only ends that fit lie beyond another event's start. AmbiguousName where
    the text as written reads as a valid string that another end would replace: one followed by members
    that repeat a key, or by another event on the name's line in a layout of events over several lines."""
    valid = VALID.match(data, start).end()
    as_string = valid if data[valid : valid + 1] == b'"' else -1
    doubt = False  # the text as written is a valid string, followed by REPEATS or FOREIGN
    if as_string >= 0 and data.find(b'"', start, as_string) < 0:  # no `"pid":` end comes before its end
        if _USUAL.match(data, as_string):
            return as_string  # the common case: a valid name
        got = follows(data, as_string, start)
        if got == OK:
            return as_string
        doubt, as_string = got != BAD, -1
    checked, reading = start, Reading(data, start)
    for q in _ends(as_string, ends(data, start, start, min(len(data), start + MAX_TEXT))):
        if data.find(b"\n", checked, q) >= 0:  # the text of a name is on one line
            break
        if reading.opens_another(q):
            return _none(doubt)
        checked = q
        got = follows(data, q, start) if q == as_string else reading.follows(q)
        if got == OK:
            return q
        doubt = doubt or (got != BAD and q == as_string)
    return _none(doubt)


def _ends(as_string: int, pid_ends: Iterator[re.Match]) -> Iterator[int]:
    """The candidate closing quotes in order: the end of the valid string (if any) among the quotes
    before a `"pid":`."""
    for m in pid_ends:
        q = m.start()
        if 0 <= as_string < q:
            yield as_string
        if as_string <= q:
            as_string = -1
        yield q
    if as_string >= 0:
        yield as_string


def _none(doubt: bool) -> None:
    if doubt:
        raise AmbiguousName("an event name whose end cannot be told apart from the members around it")
    return None
