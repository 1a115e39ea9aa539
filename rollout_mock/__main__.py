"""``python -m rollout_mock``: the same as the ``rollout-mock`` command."""

import sys

from rollout_mock.cli import main

sys.exit(main())
