"""Print README command N (1: the demo, 2: the tests) exactly as the README writes it.

The commands are the ```sh blocks under the heading "## The two commands", in order.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def commands(text: str) -> list[str]:
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


if __name__ == "__main__":
    found = commands(README.read_text(encoding="utf-8"))
    if len(found) != 2:
        sys.exit("README.md: expected two ```sh blocks under '## The two commands', "
                 f"found {len(found)}")
    print(found[int(sys.argv[1]) - 1])
