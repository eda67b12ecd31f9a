"""Benchmark specdec against Hugging Face `generate`: `python bench.py --help`; the code lives in bench/."""
from bench.cli import main

if __name__ == "__main__":
    main()
