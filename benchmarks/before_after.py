"""Two checkouts of the package, side by side in one run: ``python benchmarks/before_after.py BEFORE AFTER``.

Runs the same benchmark command in each checkout in turn (BEFORE, AFTER, BEFORE, AFTER, …: ``--rounds`` pairs, so
that drift of the machine falls on both alike), each with its own tree first on ``PYTHONPATH`` and as the working
directory, and prints, for every row of every markdown table the command printed, the median over rounds of each
numeric column before and after, and after − before. ``--command`` is run by the shell in each tree (default:
section A and A2 of ``benchmarks/run.py``, through the functions both trees have); ``--tables`` keeps the tables
whose title starts with one of the given prefixes, ``--columns`` the columns whose header does.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

SECTION_A = (
    "{python} -c \"import sys; sys.path.insert(0, 'benchmarks'); import run; run.setup_pipeline(); "
    "run.table('A. Per hooked call (ns)', run.per_call_rows({number}, {repeat}), 'ns'); "
    "run.table('A2. Other features per call (ns)', run.feature_rows({number}, {repeat}), 'ns')\""
)
NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?")


def tables(text: str) -> dict[tuple[str, str, str], float]:
    """{(table title, row's first cell, column header): the cell's leading number} of every markdown table (a header
    that repeats an earlier one's name is told apart by its count: "added (95 % interval) (2)")."""
    out: dict[tuple[str, str, str], float] = {}
    title, header = "", None
    for line in text.splitlines():
        if line.startswith("### "):
            title, header = line[4:].strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = [
                    name if cells.index(name) == i else f"{name} ({cells[:i].count(name) + 1})"
                    for i, name in enumerate(cells)
                ]
            elif not set(line) <= set("|-: "):
                for name, cell in zip(header[1:], cells[1:]):
                    match = NUMBER.match(cell)
                    if match:
                        out[(title, cells[0], name)] = float(match.group())
        else:
            header = None if not line.strip() else header
    return out


def run(tree: str, command: str) -> str:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, shell=True, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{command!r} failed in {tree}:\n{done.stderr[-2000:]}")
    return done.stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs, alternating")
    parser.add_argument("--command", help="the benchmark, run by the shell in each tree (default: sections A, A2)")
    parser.add_argument("--number", type=int, default=100_000, help="calls per repeat (default command)")
    parser.add_argument("--repeat", type=int, default=7, help="repeats per run (default command)")
    parser.add_argument("--tables", default="", help="comma-separated title prefixes of the tables to compare")
    parser.add_argument("--columns", default="", help="comma-separated column-header prefixes to compare")
    parser.add_argument("--keep", help="a directory to write each run's own printout to (before-1.txt, after-1.txt, …)")
    args = parser.parse_args(argv)
    command = args.command or SECTION_A.format(python=sys.executable, number=args.number, repeat=args.repeat)
    prefixes = tuple(p for p in args.tables.split(",") if p)
    columns = tuple(p for p in args.columns.split(",") if p)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for n in range(args.rounds):
        for side, tree in (("before", args.before), ("after", args.after)):
            printout = run(os.path.abspath(tree), command)
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                with open(os.path.join(args.keep, f"{side}-{n + 1}.txt"), "w") as f:
                    f.write(printout)
            runs[side].append(tables(printout))
            print(f"# round {n + 1}: {side} done {time.strftime('%H:%M:%S', time.gmtime())}", file=sys.stderr)
    print(f"# Before / after, alternating, {args.rounds} rounds each, from {started}")
    print(f"# before: {args.before}\n# after: {args.after}\n# command: {command}\n")
    keys = [
        k
        for k in runs["after"][0]
        if k in runs["before"][0]
        and (not prefixes or k[0].startswith(prefixes))
        and (not columns or k[2].startswith(columns))
    ]
    title = None
    for key in keys:
        if key[0] != title:
            title = key[0]
            print(f"\n### {title}\n")
            print("| row | column | before (median) | after (median) | after − before | before / after per round |")
            print("|---|---|---:|---:|---:|---|")
        before = [r[key] for r in runs["before"] if key in r]
        after = [r[key] for r in runs["after"] if key in r]
        b, a = statistics.median(before), statistics.median(after)
        rounds = "; ".join(f"{x:g} / {y:g}" for x, y in zip(before, after))
        print(f"| {key[1]} | {key[2]} | {b:g} | {a:g} | {a - b:+.3g} | {rounds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
