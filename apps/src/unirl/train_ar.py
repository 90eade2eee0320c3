"""`python -m unirl.train_ar RECIPE [a.b=value ...]`: the autoregressive trainer's entry module."""

import sys

from unirl.apps.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(
        main(args if args[:1] in (["sft"], ["eval"], ["train"]) else ["train", *args], force_trainer="ar")
    )
