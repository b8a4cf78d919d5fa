"""``python -m posbench`` == the ``posbench`` command."""

import sys

from posbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
