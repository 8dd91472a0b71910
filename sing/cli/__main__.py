"""`python -m sing.cli`: the `sing` command."""

import sys

from sing.cli import main

sys.exit(main())
