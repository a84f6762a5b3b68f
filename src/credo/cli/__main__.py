"""`python -m credo.cli`: the `credo` command."""

import sys

from credo.cli.main import main

sys.exit(main())
