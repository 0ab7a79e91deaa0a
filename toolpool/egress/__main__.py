"""``python -m toolpool.egress``: the egress proxy's process (process.py)."""

import sys

from toolpool.egress.process import main

sys.exit(main())
