"""`python -m bench`: the same as `python bench.py`."""
from bench.cli import main

main()
