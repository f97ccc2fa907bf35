"""python -m flashlab.course.figures OUTDIR — write every figure of the book (PNG + SVG)."""

import sys

import matplotlib

matplotlib.use("Agg")

from flashlab.course.figures import save_all  # noqa: E402

if __name__ == "__main__":
    outdir = sys.argv[1] if len(sys.argv) > 1 else "figures"
    for path in save_all(outdir):
        print(path)
