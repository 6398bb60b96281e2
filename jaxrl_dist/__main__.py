"""`python -m jaxrl_dist ...`: the `jaxrl-dist` console script."""
import sys

from jaxrl_dist.cli import main

if __name__ == "__main__":
    sys.exit(main())
