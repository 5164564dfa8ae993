import sys

from .devices import main

sys.exit(main())
