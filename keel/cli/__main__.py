"""``python -m keel.cli``."""

import sys

from keel.cli import main

sys.exit(main())
