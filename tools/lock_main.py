"""Entry point of //deps:<name>.update and .test (same code as the tools/lock CLI)."""

import sys

from tools.locktool import main

if __name__ == "__main__":
    sys.exit(main())
