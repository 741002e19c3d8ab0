"""``python -m ddtree_offline`` entry point."""

import sys

from .cli import main

sys.exit(main())
