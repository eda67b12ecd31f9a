"""Count words in text files and print a short report.

Usage: python word_report.py notes.txt chapter*.txt --top 15 --min-length 4
"""
import argparse
import re
import sys
from collections import Counter
from pathlib import Path

WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
STOP_WORDS = frozenset("the a an and or of to in on for with is are was were be it that this as at by".split())


def words(text, min_length=1):
    for match in WORD.finditer(text):
        word = match.group().lower().strip("'-")
        if len(word) >= min_length and word not in STOP_WORDS:
            yield word


def sentence_lengths(text):
    sentences = [s for s in re.split(r"[.!?]+\s", text) if s.strip()]
    return [len(WORD.findall(s)) for s in sentences]


def report(paths, top=10, min_length=1):
    counts = Counter()
    lengths = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            print(f"skipping {path}: {err}", file=sys.stderr)
            continue
        counts.update(words(text, min_length))
        lengths.extend(sentence_lengths(text))
    lines = [f"{sum(counts.values())} words, {len(counts)} distinct"]
    if lengths:
        mean = sum(lengths) / len(lengths)
        lines.append(f"{len(lengths)} sentences, {mean:.1f} words on average, longest {max(lengths)}")
    width = max((len(w) for w, _ in counts.most_common(top)), default=0)
    for word, n in counts.most_common(top):
        lines.append(f"  {word:<{width}}  {n:>6}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="word frequencies of text files")
    parser.add_argument("paths", nargs="+", help="text files to read")
    parser.add_argument("--top", type=int, default=10, help="how many words to list")
    parser.add_argument("--min-length", type=int, default=1, help="ignore shorter words")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error("--top must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    print(report(args.paths, args.top, args.min_length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
