"""Entry point of //deps:<name>.update and .test (same code as the tools/lock CLI).

Runnable as a script from any directory: the checkout (or the runfiles' _main) goes on sys.path.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.locktool import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
