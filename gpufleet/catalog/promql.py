"""The metric names a PromQL expression reads (pure; no PromQL library exists for Python).

Enough of PromQL's lexical grammar to find every series selector in the catalog's expressions:
string literals, label matchers `{...}`, range and subquery brackets `[...]` and the label lists of
`by`, `without`, `on`, `ignoring`, `group_left` and `group_right` are removed first; what remains
that is an identifier, is not a keyword and is not called as a function is a metric name. A selector
written only as `{__name__="x"}` is read from its matcher. The catalog never uses `{__name__=~...}`
regex selectors; an expression that does is refused, since what it reads cannot be known.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "atan2", "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_NAME_MATCHER = re.compile(r'__name__\s*(=~|!=|!~|=)\s*"([^"]*)"')
_COMMENT = re.compile(r"#[^\n]*")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects. Raises ValueError for a regex on `__name__`."""
    names: set[str] = set()
    text = _COMMENT.sub(" ", expr)
    # Matchers first (strings inside them may hold braces), keeping `__name__="x"` selectors.
    for m in _NAME_MATCHER.finditer(text):
        if m.group(1) != "=":
            raise ValueError(f"a selector matches __name__ with {m.group(1)}: what it reads cannot be known")
        names.add(m.group(2))
    text = _MATCHERS.sub(" ", text)
    text = _STRING.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = re.sub(r"\b\d[\w.]*", " ", text)  # numbers and durations (0x.., 1e6, 5m)
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names
