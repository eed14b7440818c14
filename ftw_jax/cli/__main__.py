"""`python -m ftw_jax.cli`: the `ftw-jax` command."""

import sys

from ftw_jax.cli import main

sys.exit(main())
