"""Engine step-time benchmark; the code ships in the package as ``accumguard bench``
(:mod:`accumguard.demo.bench`) so that it runs from an installed wheel too."""

import sys

from accumguard.demo.bench import main

if __name__ == "__main__":
    sys.exit(main())
