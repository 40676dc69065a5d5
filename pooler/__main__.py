"""`python -m pooler ...`: the same command line as `pooler ...`."""
import sys

from pooler.cli.main import main

sys.exit(main())
