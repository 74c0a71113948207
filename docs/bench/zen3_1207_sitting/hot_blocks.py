"""Two GCC assembly listings of q8dot.c (gcc -S, the build's flags): their basic blocks with 8 or more of one
instruction (vpdpbusd, vpmaddubsw), and what those hot blocks hold between them: instructions, stack references.
Usage: python3 hot_blocks.py old.s new.s vpdpbusd"""
import re
import sys


def basic_blocks(path: str) -> list[list[str]]:
    """Each labelled block's instructions (no directives)."""
    blocks, current = [], []
    for line in open(path):
        if re.match(r"^(\.L\w+|[a-z_][\w.]*):", line):
            blocks.append(current)
            current = []
            continue
        line = line.strip()
        if line and not line.startswith("."):
            current.append(line)
    blocks.append(current)
    return blocks


def hot(path: str, op: str) -> list[tuple[int, int, int]]:
    """(count of op, instructions, stack references) of each block with 8 or more op."""
    rows = []
    for block in basic_blocks(path):
        ops = sum(1 for line in block if line.startswith(op))
        if ops >= 8:
            stack = sum(1 for line in block if "(%rsp)" in line or "(%rbp)" in line)
            rows.append((ops, len(block), stack))
    return rows


def main() -> None:
    old_path, new_path, op = sys.argv[1:4]
    old, new = hot(old_path, op), hot(new_path, op)
    for name, column in (("hot blocks", None), (op, 0), ("instructions", 1), ("stack references", 2)):
        if column is None:
            print(f"{name}: {len(old)} -> {len(new)}")
            continue
        print(f"{name}: {sum(r[column] for r in old)} -> {sum(r[column] for r in new)}")
    for name, column in (("instructions", 1), ("stack references", 2)):
        before = sum(r[column] for r in old) / sum(r[0] for r in old)
        after = sum(r[column] for r in new) / sum(r[0] for r in new)
        print(f"{name} a {op}: {before:.2f} -> {after:.2f}")


if __name__ == "__main__":
    main()
