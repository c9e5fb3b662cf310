"""``python -m posttrain``: the ``posttrain`` command (as ``python -m posttrain.cli``)."""

import sys

from posttrain.cli.main import main

sys.exit(main())
