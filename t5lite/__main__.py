"""`python -m t5lite` is the `t5lite` command."""

import sys

from t5lite.cli import main

sys.exit(main())
