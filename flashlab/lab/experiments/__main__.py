import argparse

from flashlab.lab.results import RESULTS_DIR
from flashlab.lab.experiments import EXPERIMENTS, require_gpu, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.experiments", description="GPU experiments of chapters 5-9")
    parser.add_argument("names", nargs="+", choices=sorted(EXPERIMENTS), help="experiments to run, in order")
    parser.add_argument("--out", default=str(RESULTS_DIR), help="results folder")
    args = parser.parse_args()
    require_gpu()
    run(args.names, args.out)


if __name__ == "__main__":  # guarded: precompile's spawned workers import this module again
    main()
