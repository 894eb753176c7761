"""``python -m operations.loop``: runs operations.loop.main (the flags: ``--help``)."""

import sys

from operations.loop import main

if __name__ == "__main__":
    sys.exit(main())
