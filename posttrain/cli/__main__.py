"""``python -m posttrain.cli``: the ``posttrain`` command."""

import sys

from posttrain.cli.main import main

sys.exit(main())
