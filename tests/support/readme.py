"""The README, parsed: its fenced code blocks under their headings, and each shell command of a bash block.

Used by ``tests/deploy/test_readme.py`` (every README command accounted for) and by the tests that run a
README section as written on a platform they start anyway (``tests/chaos/test_chaos.py``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass(frozen=True)
class Block:
    """A fenced code block: the nearest heading above it (## or ###), its language and text."""

    section: str
    language: str
    text: str


@dataclass(frozen=True)
class Command:
    """One shell command of a block, continuation lines joined, and the comment lines right after it."""

    block: Block
    text: str
    notes: tuple[str, ...] = field(default=())

    @property
    def words(self) -> str:
        """The command's words, unquoted, without its trailing comment: what rules match."""
        return " ".join(shlex.split(self.text, comments=True))


def readme_blocks() -> list[Block]:
    blocks, section = [], ""
    lines = README.read_text().splitlines(keepends=True)
    i = 0
    while i < len(lines):
        fence = re.match(r"```(\w*)\s*$", lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(section, fence.group(1), "".join(lines[i + 1:end])))
            i = end + 1
            continue
        heading = re.match(r"#{2,3} (.+)", lines[i])
        if heading:
            section = heading.group(1).strip()
        i += 1
    return blocks


def bash_blocks(section: str | None = None) -> list[Block]:
    return [b for b in readme_blocks() if b.language == "bash" and section in (None, b.section)]


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    for line in block.text.replace("\\\n", " ").splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            if found:
                found[-1] = Command(block, found[-1].text, (*found[-1].notes, line.strip()))
            continue
        found.append(Command(block, line.strip()))
    return found
