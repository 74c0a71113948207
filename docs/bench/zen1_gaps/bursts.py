"""Sum a batcher trace (`trace_0b6a6fe.diff`) by burst of `specdec bench --concurrency 8`: passes, rows, how long
passes waited, the sessions' gaps (p50, p90), and the passes that left a session behind (fewer than 8 rows, all
sessions in a round taken, one still away). Usage: `python bursts.py TRACE`."""
import statistics
import sys
from collections import Counter

# Fields of a line: "pass T rows R tok K waited W active A left L away ..." and "enter T KEY gap G ...".
ROWS, TOKENS, WAITED, ACTIVE, FIRST_AWAY = 3, 5, 7, 9, 13
GAP = 4


def is_prefill(line: list[str]) -> bool:
    """A burst's first pass: the prompts' prefill (40 tokens or more over 5 rows or more)."""
    return line[0] == "pass" and int(line[TOKENS]) >= 40 and int(line[ROWS]) >= 5


def burst_starts(lines: list[list[str]]) -> list[int]:
    """The line where each burst begins (its prefill passes, which may be two in a row, count as one)."""
    starts: list[int] = []
    for i, line in enumerate(lines):
        previous_prefill = i >= 2 and is_prefill(lines[i - 2])
        if is_prefill(line) and (i == 0 or not previous_prefill) and (not starts or i - starts[-1] > 40):
            starts.append(i)
    return starts


def summary(burst: list[list[str]]) -> str:
    passes = [line for line in burst if line[0] == "pass"]
    rows = [int(p[ROWS]) for p in passes]
    span = float(passes[-1][1]) - float(passes[0][1])
    left_behind = sum(1 for p in passes if int(p[ROWS]) == int(p[ACTIVE]) and len(p) >= FIRST_AWAY and int(p[ROWS]) < 8)
    gaps = sorted(float(line[GAP]) for line in burst if line[0] == "enter" and float(line[GAP]) > 0)
    waited = statistics.mean(float(p[WAITED]) for p in passes)
    return (f"passes {len(passes)} rows {sum(rows)} mean {sum(rows) / len(passes):.2f} span {span:.2f}s "
            f"waited {waited:.2f} gap p50 {gaps[len(gaps) // 2]:.1f} p90 {gaps[int(.9 * len(gaps))]:.1f} "
            f"missed-with-away {left_behind} {sorted(Counter(rows).items())}")


def main(path: str) -> None:
    lines = [line.split() for line in open(path)]
    starts = burst_starts(lines) + [len(lines)]
    for begin, end in zip(starts, starts[1:]):
        print(summary(lines[begin:end]))


if __name__ == "__main__":
    main(sys.argv[1])
