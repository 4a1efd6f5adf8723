"""``python -m txn_core.cli``: the same as the ``txnlog`` console script."""

import sys

from txn_core.cli import main

sys.exit(main())
