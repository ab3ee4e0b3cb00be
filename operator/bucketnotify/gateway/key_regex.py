"""Key filter regexes the gateway can run: a checked subset of its ECMAScript dialect.

The gateway compiles a notification's key regex with C++ ``std::regex`` (ECMAScript grammar)
only when an object is written, and on Ceph 16.2.15 a regex that does not compile aborts the
whole radosgw process at that upload (measured: ``a{``, ``a{,3}``, ``(?>a)``, ``^*a``,
``\\N{...}``, ``[\\w-z]``; the configuration PUT itself accepts them). Python's ``re``
accepts several of those, so it cannot be the judge. ``regex_problem`` parses the pattern
with the grammar below, a subset of ECMAScript that both engines read the same way, and
names the first thing outside it; whatever it accepts compiles in ``std::regex``
(tests/integration/test_key_regex_on_gateway.py runs every construct on the gateway).

    pattern     := alternative ("|" alternative)*
    alternative := (assertion | atom quantifier?)*
    assertion   := "^" | "$" | "\\b" | "\\B" | "(?=" pattern ")" | "(?!" pattern ")"
    atom        := "." | literal | escape | class | "(" pattern ")" | "(?:" pattern ")"
    quantifier  := ("*" | "+" | "?" | "{" n "}" | "{" n ",}" | "{" n "," m "}") "?"?   n <= m
    escape      := "\\" (d D w W s S f n r t v | 0 | x hh | u hhhh | c letter | back reference
                   to a group already opened | one of ^ $ \\ . * + ? ( ) [ ] { } | / -)
    class       := "[" "^"? (class atom | class atom "-" class atom)* "]"   first <= last
                   (a class atom: any character but "\\" and "]", or an escape as above,
                   "\\b" for backspace, no back reference; a range has no \\d-like ends)

Stricter than the gateway where that costs nothing: an unescaped ``{``, ``}`` or ``]``
outside a class, a quantifier on a quantifier (``a++``) and POSIX classes (``[[:alpha:]]``)
are refused with what to write instead.
"""

from __future__ import annotations

__all__ = ["regex_problem"]

SYNTAX = set("^$\\.*+?()[]{}|")
IDENTITY_ESCAPES = SYNTAX | {"/", "-"}
CLASS_ESCAPES = set("dDwWsS")
CONTROL_ESCAPES = {"f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
HEX = set("0123456789abcdefABCDEF")


class _Refused(Exception):
    def __init__(self, at: int, what: str) -> None:
        super().__init__(f"{what} at position {at}")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.groups = 0
        self.closed: set[int] = set()

    def peek(self, count: int = 1) -> str:
        return self.text[self.at : self.at + count]

    def refuse(self, what: str, at: int | None = None) -> _Refused:
        return _Refused(self.at if at is None else at, what)

    def pattern(self) -> None:
        self.alternative()
        while self.peek() == "|":
            self.at += 1
            self.alternative()

    def alternative(self) -> None:
        while self.at < len(self.text) and self.peek() not in ("|", ")"):
            if self.assertion():
                if self.peek() and self.peek() in "*+?{":
                    raise self.refuse("a quantifier after an assertion (nothing to repeat)")
                continue
            self.atom()
            self.quantifier()

    def assertion(self) -> bool:
        if self.peek() in ("^", "$"):
            self.at += 1
            return True
        if self.peek(2) in ("\\b", "\\B"):
            self.at += 2
            return True
        if self.peek(3) in ("(?=", "(?!"):
            self.at += 3
            self.group_body()
            return True
        return False

    def group_body(self) -> None:
        start = self.at
        self.pattern()
        if self.peek() != ")":
            raise self.refuse("a group that is never closed", start - 1)
        self.at += 1

    def atom(self) -> None:
        char = self.peek()
        if char == ".":
            self.at += 1
        elif char == "\\":
            self.escape(in_class=False)
        elif char == "[":
            self.char_class()
        elif char == "(":
            if self.peek(3) == "(?:":
                self.at += 3
                self.group_body()
            elif self.peek(2) == "(?":
                raise self.refuse(
                    "a group kind the gateway's ECMAScript regex lacks (only (...), (?:...),"
                    " (?=...) and (?!...) are allowed)"
                )
            else:
                self.at += 1
                self.groups += 1
                number = self.groups
                self.group_body()
                self.closed.add(number)
        elif char in "*+?":
            raise self.refuse(f"{char!r} with nothing to repeat")
        elif char in "{}]":
            raise self.refuse(f"an unescaped {char!r} (write \\{char} for the character)")
        else:
            self.at += 1

    def quantifier(self) -> None:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.at += 1
        elif char == "{":
            self.braces()
        else:
            return
        if self.peek() == "?":
            self.at += 1  # lazy
        if self.peek() and self.peek() in "*+?{":
            raise self.refuse("a quantifier on a quantifier (use a group: (?:a+)+)")

    def braces(self) -> None:
        start = self.at
        self.at += 1
        low = self.number()
        if low is None:
            raise self.refuse("'{' not followed by a count (write \\{ for the character)", start)
        high: int | None = low
        if self.peek() == ",":
            self.at += 1
            high = self.number()
        if self.peek() != "}":
            raise self.refuse("a count {n}, {n,} or {n,m} that is not closed by '}'", start)
        self.at += 1
        if high is not None and high < low:
            raise self.refuse(f"a count {{{low},{high}}} whose maximum is below its minimum", start)

    def number(self) -> int | None:
        start = self.at
        while self.peek().isdigit() and self.peek().isascii():
            self.at += 1
        return int(self.text[start : self.at]) if self.at > start else None

    def escape(self, in_class: bool) -> str | None:
        """Reads one escape; the character it stands for, None for a class like \\d."""
        start = self.at
        self.at += 1
        char = self.peek()
        if not char:
            raise self.refuse("a '\\' at the end of the pattern", start)
        self.at += 1
        if char in CLASS_ESCAPES:
            return None
        if char in CONTROL_ESCAPES:
            return CONTROL_ESCAPES[char]
        if char in IDENTITY_ESCAPES:
            return char
        if char == "b" and in_class:
            return "\b"
        if char == "0" and not self.peek().isdigit():
            return "\0"
        if char == "x":
            return self.hex_digits(2, start)
        if char == "u":
            return self.hex_digits(4, start)
        if char == "c" and self.peek().isascii() and self.peek().isalpha():
            self.at += 1
            return chr(ord(self.text[self.at - 1]) % 32)
        if char.isdigit() and char != "0" and not in_class:
            self.at -= 1
            number = self.number()
            if number not in self.closed:
                raise self.refuse(f"\\{number} refers to no group closed before it", start)
            return None
        raise self.refuse(f"the escape \\{char}, which the gateway's ECMAScript regex lacks", start)

    def hex_digits(self, count: int, start: int) -> str:
        digits = self.peek(count)
        if len(digits) != count or not set(digits) <= HEX:
            raise self.refuse(f"\\{self.text[start + 1]} needs {count} hex digits", start)
        self.at += count
        return chr(int(digits, 16))

    def char_class(self) -> None:
        start = self.at
        self.at += 1
        if self.peek() == "^":
            self.at += 1
        while self.peek() != "]":
            if not self.peek():
                raise self.refuse("a '[' class that is never closed", start)
            first = self.class_atom()
            # A '-' before the closing ']' is the character itself.
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):
                dash = self.at
                self.at += 1
                last = self.class_atom()
                if first is None or last is None:
                    raise self.refuse("a range with a class such as \\d at one end", dash)
                if ord(last) < ord(first):
                    raise self.refuse(f"a range {first!r}-{last!r} out of order", dash)
        self.at += 1

    def class_atom(self) -> str | None:
        char = self.peek()
        if char == "\\":
            return self.escape(in_class=True)
        if char == "[" and self.peek(2)[1:] in (":", "=", "."):
            raise self.refuse("a POSIX class such as [[:alpha:]] (use \\w, \\d, \\s or a range)")
        self.at += 1
        return char


def regex_problem(regex: str) -> str | None:
    """Why ``regex`` cannot be a gateway key filter, or None when it can."""
    parser = _Parser(regex)
    try:
        parser.pattern()
        if parser.at < len(regex):
            raise parser.refuse("a ')' that closes no group")
    except _Refused as refused:
        return f"filter.key.regex is outside the gateway's regex dialect: {refused}"
    return None
