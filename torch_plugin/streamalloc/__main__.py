"""`python -m streamalloc [--conf CONF] script.py [args]`: run a program with streamalloc enabled."""

import sys

from ._launcher import main

sys.exit(main())
