"""Word-wise wildcard matching for addresses and settings patterns (B-011, B-100, B-101).

Words are separated by the delimiter ('.'); the single-word wildcard ('*') matches exactly
one word, the any-words wildcard ('#') matches zero or more words and is valid only as the
last word. `a.#` therefore matches `a` itself. Matching is on whole words: `my.*` does not
match `myqueue`. A pattern has no empty words (`a..b`, `.a`, `a.`: `validate_pattern`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WildcardConfig:
    """`wildcard-addresses` (B-104): enabled, delimiter, any-words, single-word."""

    enabled: bool = True
    delimiter: str = "."
    any_words: str = "#"
    single_word: str = "*"

    def has_wildcard(self, name: str) -> bool:
        """Whether `name` contains a wildcard word (so it is a pattern, not a literal)."""
        if not self.enabled:
            return False
        return any(w in (self.any_words, self.single_word) for w in name.split(self.delimiter))

    def validate_pattern(self, pattern: str) -> str | None:
        """Return why `pattern` is invalid (B-101), or None when it is valid.

        Besides B-101's rule, a pattern of more than one word may not have an empty word
        (two delimiters together, or one at either end): Artemis (`Match.verify`) takes
        `orders..#` and it then matches only addresses that themselves have an empty
        word, never the `orders.#` it surely meant, so a typo in a security-settings
        match left its addresses to a broader entry's permissions (docs/decisions.md
        "Loose ends"). The hint drops the empty words."""
        words = pattern.split(self.delimiter)
        for i, word in enumerate(words):
            if self.any_words in word and (word != self.any_words or i != len(words) - 1):
                return f"'{self.any_words}' is allowed only as the last word of a pattern"
        if len(words) > 1 and "" in words:
            d = self.delimiter
            where = (
                f"a leading {d!r}"
                if not words[0]
                else f"a trailing {d!r}"
                if not words[-1]
                else f"two {d!r} together"
            )
            meant = d.join(w for w in words if w)
            hint = f": did you mean {meant!r}?" if meant else ""
            return f"an empty word ({where}){hint}"
        return None

    def matches(self, pattern: str, address: str) -> bool:
        """Whether the wildcard `pattern` matches the concrete `address`."""
        return _match(
            tuple(pattern.split(self.delimiter)),
            tuple(address.split(self.delimiter)),
            self.any_words,
            self.single_word,
        )

    def specificity_key(self, pattern: str) -> tuple[object, ...]:
        """Sort key: smaller is more specific (B-100 order, Artemis MatchComparator)."""
        words = pattern.split(self.delimiter)
        if not self.has_wildcard(pattern):
            return (0,)
        if self.any_words in words:
            # Between two '#' patterns the longer string is more specific.
            return (3, -len(pattern))
        if self.single_word not in words:
            return (1,)
        # Both have '*': literal beats '*' word by word from the left; then more words wins;
        # then the shorter string. Each word is 0 (literal) or 1 ('*'); the end marker 2
        # sorts after both, so the pattern that runs out of words first loses.
        shape = (*(1 if w == self.single_word else 0 for w in words), 2)
        return (2, shape, len(pattern))


@functools.lru_cache(maxsize=65536)
def _match(pattern: tuple[str, ...], words: tuple[str, ...], any_w: str, one_w: str) -> bool:
    if not pattern:
        return not words
    head = pattern[0]
    if head == any_w:
        # '#' is last (validated), so it matches whatever remains, including nothing.
        return True
    if not words:
        return False
    if head == one_w or head == words[0]:
        return _match(pattern[1:], words[1:], any_w, one_w)
    return False
