"""`python -m jaxrl_dist.cli ...`: the `jaxrl-dist` console script."""
import sys

from jaxrl_dist.cli import main

sys.exit(main())
