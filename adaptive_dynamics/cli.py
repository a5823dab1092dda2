"""`adaptive-dynamics` console entry (placeholder, filled in below)."""
import sys


def main(argv=None):
    print("adaptive-dynamics: not yet implemented", file=sys.stderr)
    return 2
